from rlvr.cli.main import main

raise SystemExit(main())
