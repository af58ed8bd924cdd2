"""The ground floor: what every other floor of mpitrain uses, importing nothing of mpitrain above it.

`errors` (the user's errors, one line each), `arrays` (numpy or cupy, whichever owns an array), `workspace` (the
arrays a step writes, made once), `files` (the one atomic file writer and its one-line OS errors), `threads` (the
thread plan, sized before numpy or numba loads). docs/architecture.md's layout section gives the floors above it.
"""
