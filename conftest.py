"""Suite-wide test setup.

Ctrl-C is part of what the suite tests (a command-line user's cancel, a bring-up's stop).
A job that a script starts in the background without job control (`cmd &`, nohup) ignores
SIGINT, and Python then never raises KeyboardInterrupt: not in this process
(`_thread.interrupt_main()` does nothing) and not in the nodes and commands the tests
start, which inherit the ignored signal. Python's handler is restored here, so the
processes the tests start begin with the default disposition, as from a terminal.
"""
import signal

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
