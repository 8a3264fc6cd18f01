"""One module per command of the `mtt` command line, each orchestration only."""
