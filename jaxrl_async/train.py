"""`python -m jaxrl_async.train`: kept at this path so the documented command stays as it is; the
command line is jaxrl_async/cli/train.py (import from there)."""

if __name__ == "__main__":
    from jaxrl_async.cli.interrupt import exit_on_interrupt

    exit_on_interrupt()  # before the command's imports: a Ctrl-C during them is one line too
    from jaxrl_async.cli.train import run

    run()
