"""Demo downstream systems (payments, inventory, email) for the Reversi demo and tests.

- server.py: the HTTP server hosting the three systems (run it as a script).
- tool.py:   the compensator/reader command for Reversi Jobs (stand-alone script).
- client.py: a typed urllib client for forward calls.

Not part of the operator package.
"""
