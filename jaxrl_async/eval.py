"""`python -m jaxrl_async.eval`: kept at this path so the documented command stays as it is; the
command line is jaxrl_async/cli/eval.py (import from there)."""

if __name__ == "__main__":
    from jaxrl_async.cli.eval import run

    run()
