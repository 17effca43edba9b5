"""``python -m tether.testing.fake_openai``: serve the fake as a process (benchmarks, by hand)."""

from __future__ import annotations

import argparse

from tether.testing.fake_openai.replies import echo_reply
from tether.testing.fake_openai.server import FakeOpenAIServer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tether.testing.fake_openai",
        description="Serve a fake OpenAI-compatible API that echoes the last user message.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before each answer")
    parser.add_argument("--embedding-dim", type=int, default=64)
    parser.add_argument("--reply", help="answer every chat request with this text instead")
    args = parser.parse_args(argv)
    server = FakeOpenAIServer(
        args.latency_ms,
        args.reply if args.reply is not None else echo_reply,
        embedding_dim=args.embedding_dim,
        host=args.host,
        port=args.port,
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
