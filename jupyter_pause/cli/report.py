"""``jupyter pause report``: read the timelines, print the report, write its folder."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..kernel.store import default_store_root
from ..usage import render, report, sources
from .client import EXIT_NO_SERVER, EXIT_OK, EXIT_USAGE, Client, CliError, find_server
from .output import print_json


def listing_of(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """(the usage listing, where it came from): the store when asked, else the server, else
    the default store when no server runs."""
    if args.store is None:
        try:
            server = find_server(args)
        except CliError as err:
            if err.code != EXIT_NO_SERVER or args.url:
                raise
            print(f"jupyter pause: {err}; reading the store instead", file=sys.stderr)
        else:
            return Client(server).get("usage"), f"server {server.url}"
    store = Path(args.store) if args.store else default_store_root()
    if not store.is_dir():
        # The first checkpoint makes the store: without one, nothing was paused yet here.
        source = f"no store at {store} yet (the first checkpoint makes it)"
        return sources.listing(store, [], {}), source
    return sources.listing(store, sources.read_store(store), {}), f"store {store}"


def run(args: argparse.Namespace) -> int:
    try:
        since = report.parse_since(args.since) if args.since != "all" else None
    except ValueError as err:
        raise CliError(f"--since {err}", EXIT_USAGE) from None
    listing, source = listing_of(args)
    prices = {
        name: value
        for name, value in (
            ("gpu_hour", args.gpu_hour_price),
            ("storage_gb_month", args.storage_gb_month_price),
        )
        if value is not None
    }
    numbers = report.build(listing, since, args.by, prices)
    numbers["source"] = source
    written: list[Path] = []
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            written = render.charts(numbers, folder)
        except ImportError as err:
            print(f"jupyter pause: {err}", file=sys.stderr)
        (folder / "report.json").write_text(json.dumps(numbers, indent=2) + "\n")
        (folder / "report.md").write_text(render.markdown(numbers, source, written))
    if args.json:
        print_json(numbers)
    else:
        sys.stdout.write(render.markdown(numbers, source, written))
    return EXIT_OK
