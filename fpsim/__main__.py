import sys

try:
    from .cli import main
except KeyboardInterrupt:          # Ctrl-C while fpsim is still loading
    print("fpsim: interrupted (Ctrl-C)", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
