from amp_rewrite.cli import entry

entry()
