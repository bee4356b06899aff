"""Write broker/ngsi/openapi.json, the description ``GET /v2/openapi.json`` serves, from
docs/openapi.yaml (the source; edit that one). tests/ngsi/test_openapi.py checks the two
agree."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "openapi.yaml"
TARGET = ROOT / "broker" / "ngsi" / "openapi.json"


def main() -> None:
    description = yaml.safe_load(SOURCE.read_text())
    TARGET.write_text(json.dumps(description, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {TARGET.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
