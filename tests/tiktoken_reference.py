"""OpenAI's tiktoken as the reference tokenizer, offline.

tiktoken cannot download its vocabularies here, so they are read from the files the tiktoken-rs
crate ships, through tiktoken's own loader, which checks each file against the hash tiktoken pins
for the official one. Used by the tests and the micro-benchmarks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import tiktoken
import tiktoken.load
from tiktoken_ext import openai_public  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[1]


def vocabulary_dir() -> Path | None:
    """The tiktoken-rs crate's assets folder, found through cargo; None when cargo cannot say."""
    if shutil.which("cargo") is None:
        return None
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked"], cwd=ROOT, capture_output=True, check=False
    )
    if out.returncode != 0:
        return None
    for package in json.loads(out.stdout)["packages"]:
        if package["name"] == "tiktoken-rs":
            assets = Path(package["manifest_path"]).parent / "assets"
            return assets if assets.is_dir() else None
    return None


def load(names: tuple[str, ...] = ("o200k_base", "cl100k_base")) -> dict[str, tiktoken.Encoding] | None:
    assets = vocabulary_dir()
    if assets is None:
        return None
    original = tiktoken.load.load_tiktoken_bpe

    def load_local(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        if not expected_hash:
            raise ValueError(f"tiktoken pins no hash for {url}")
        return original(str(assets / url.rsplit("/", 1)[-1]), expected_hash=expected_hash)

    saved_cache = os.environ.get("TIKTOKEN_CACHE_DIR")
    saved_loader = openai_public.load_tiktoken_bpe
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TIKTOKEN_CACHE_DIR"] = cache
        openai_public.load_tiktoken_bpe = load_local
        try:
            return {name: tiktoken.Encoding(**getattr(openai_public, name)()) for name in names}
        finally:
            openai_public.load_tiktoken_bpe = saved_loader
            if saved_cache is None:
                os.environ.pop("TIKTOKEN_CACHE_DIR", None)
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = saved_cache
