"""One module per subcommand: ``configure(parser)`` adds its arguments, ``run(args)`` does it."""
