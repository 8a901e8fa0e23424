import sys

from launch.launch import main

sys.exit(main())
