"""Configuration: the YAML file and `--set` overrides read into typed sections, checked at load
(`sections`), resolved once with what set-up decides into the frozen config a run records
(`resolved`), and the generated reference page (`reference`)."""
