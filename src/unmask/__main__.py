from unmask.cli import main

raise SystemExit(main())
