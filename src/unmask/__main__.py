from unmask.cli import main

if __name__ == "__main__":  # spawned tensor-parallel ranks import this module without running the CLI
    raise SystemExit(main())
