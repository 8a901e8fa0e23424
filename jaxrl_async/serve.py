"""`python -m jaxrl_async.serve`: the stable command name; the command line is jaxrl_async/cli/serve.py
(import from there), the server jaxrl_async/serving/."""

if __name__ == "__main__":
    from jaxrl_async.cli.serve import run

    run()
