"""`python -m jaxrl_async.generate`: kept at this path so the documented command stays as it is; the
command line is jaxrl_async/cli/generate.py (import from there)."""

if __name__ == "__main__":
    from jaxrl_async.cli.generate import run

    run()
