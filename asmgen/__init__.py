"""Build-time code: generators and sources of every code object, the gfx950 ISA simulator, the build driver."""
