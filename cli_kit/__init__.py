"""What both command lines share, and nothing else: usage errors in words, help without
boxes, `--version` (`cli_kit.usage`). The relay and the client each import it; it imports
neither (the `cli-kit-alone` import contract)."""
