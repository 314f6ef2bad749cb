"""The engine in its own process, shared by several web workers over a Unix socket: `server`
serves any engine there, `client` is what each worker uses as its engine (ENGINE=process)."""
