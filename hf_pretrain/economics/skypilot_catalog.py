"""SkyPilot's price catalog as offers: every (cloud, region, card, GPU count, spot or on-demand) it lists, at its
cheapest hourly price, the card found in the GPU table by its catalog spelling (machine/gpus.yaml `skypilot`).

SkyPilot keeps one `vms.csv` per cloud under `~/.sky/catalogs/v8/` (schema v8, SkyPilot 0.14), refreshed
when it runs (`sky check`, `sky launch`). Each cloud writes its own column order, some without `SpotPrice`
or `AvailabilityZone`, so the columns are read by their header names. A price that is empty, zero or not a
number is no offer: one cloud writes `0.00` as the spot price of every row, a placeholder, not a price.
A folder that holds no readable catalog raises `CatalogError`, one line: the caller says so and uses the
shipped table.
"""

from __future__ import annotations

import csv
import math
import time
from dataclasses import dataclass
from pathlib import Path

from hf_pretrain.machine.gpus import GPU, skypilot_gpu

SCHEMA = "v8"  # the catalog version SkyPilot 0.14 reads
DEFAULT_CATALOG = Path("~/.sky/catalogs") / SCHEMA
REQUIRED_COLUMNS = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "Region")


class CatalogError(ValueError):
    """A catalog folder that cannot be read as SkyPilot's: one line naming the file and what is wrong."""


@dataclass(frozen=True)
class Offer:
    """One way to rent: `gpus` cards named `accelerator` (the catalog's spelling, what a task asks SkyPilot
    for) in `cloud`'s `region`, spot or on-demand, at `price_per_hour` for the whole machine."""

    cloud: str
    region: str
    accelerator: str
    gpus: int
    spot: bool
    price_per_hour: float
    instance_type: str
    gpu: GPU | None  # the GPU table's entry; None: a card the table does not know

    @property
    def card(self) -> str:
        return self.gpu.name if self.gpu else self.accelerator


@dataclass(frozen=True)
class CatalogFile:
    cloud: str
    path: Path
    age_days: float  # since the file was last written (SkyPilot rewrites it when it fetches prices)
    rows: int


@dataclass(frozen=True)
class Catalog:
    folder: Path
    files: tuple[CatalogFile, ...]
    offers: tuple[Offer, ...]  # the cheapest of each (cloud, region, card, count, spot), cheapest first

    def describe(self) -> str:
        """The prices' source and date, said once: the folder, the clouds, the files' ages."""
        ages = [f.age_days for f in self.files]
        when = (
            f"written {min(ages):.0f}-{max(ages):.0f} days ago"
            if round(min(ages)) != round(max(ages))
            else f"written {ages[0]:.0f} days ago"
        )
        clouds = ", ".join(f.cloud for f in self.files)
        return f"SkyPilot's catalog {self.folder} ({SCHEMA}; {clouds}; {when}: `sky check` fetches today's)"


def catalog_folder(path: str | Path | None) -> Path | None:
    """The folder holding `<cloud>/vms.csv`: `path` itself, or its `v8` (or `catalogs/v8`) below it; with no
    path, SkyPilot's own where it exists, else None (no catalog: the shipped table)."""
    if path is None:
        default = DEFAULT_CATALOG.expanduser()
        return default if any(default.glob("*/vms.csv")) else None
    folder = Path(path).expanduser()
    for candidate in (folder, folder / SCHEMA, folder / "catalogs" / SCHEMA):
        if any(candidate.glob("*/vms.csv")):
            return candidate
    if not folder.is_dir():
        raise CatalogError(f"no catalog folder {folder}: give the folder SkyPilot writes, e.g. {DEFAULT_CATALOG}")
    raise CatalogError(
        f"{folder} holds no <cloud>/vms.csv (SkyPilot's {SCHEMA} catalog): `sky check` fetches it into {DEFAULT_CATALOG}"
    )


def _price(text: str | None) -> float | None:
    """A positive finite price, else None (empty, `0.00` placeholders, `nan`)."""
    try:
        value = float(text) if text not in (None, "") else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def _gpu_count(text: str) -> int | None:
    try:
        count = float(text)
    except ValueError:
        return None
    return int(count) if count.is_integer() and count >= 1 else None


def read_cloud(path: Path) -> list[Offer]:
    """Every offer of one cloud's `vms.csv` (a row with an on-demand and a spot price is two offers)."""
    cloud = path.parent.name
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise CatalogError(
                    f"{path}: no column {', '.join(missing)}; not SkyPilot's {SCHEMA} catalog "
                    f"(columns {', '.join(reader.fieldnames or ['none'])})"
                )
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CatalogError(f"cannot read {path}: {exc}") from None
    offers = []
    for row in rows:
        accelerator, count = (row.get("AcceleratorName") or "").strip(), _gpu_count(row.get("AcceleratorCount") or "")
        if not accelerator or count is None:  # a CPU machine, or a fractional GPU
            continue
        gpu = skypilot_gpu(accelerator, row.get("InstanceType") or "")
        for spot, price in ((False, _price(row.get("Price"))), (True, _price(row.get("SpotPrice")))):
            if price is not None:
                offers.append(Offer(cloud, row["Region"], accelerator, count, spot, price, row["InstanceType"], gpu))
    return offers


def cheapest_per_place(offers: list[Offer]) -> list[Offer]:
    """The cheapest instance of each (cloud, region, card, count, spot): what SkyPilot rents when asked for
    that card there (zones and instance types collapse into it), cheapest first."""
    best: dict[tuple, Offer] = {}
    for offer in offers:
        key = (offer.cloud, offer.region, offer.accelerator, offer.gpus, offer.spot)
        if key not in best or offer.price_per_hour < best[key].price_per_hour:
            best[key] = offer
    return sorted(best.values(), key=lambda o: (o.price_per_hour, o.cloud, o.region, o.accelerator))


def read_catalog(folder: Path, now: float | None = None) -> Catalog:
    """Every cloud's offers in `folder` (`<cloud>/vms.csv`); raises CatalogError when none can be read."""
    now = time.time() if now is None else now
    files, offers = [], []
    for path in sorted(folder.glob("*/vms.csv")):
        cloud_offers = read_cloud(path)
        files.append(
            CatalogFile(path.parent.name, path, max(0.0, now - path.stat().st_mtime) / 86400, len(cloud_offers))
        )
        offers += cloud_offers
    if not offers:
        raise CatalogError(f"{folder}: no GPU offer in any vms.csv; `sky check` fetches the catalog")
    return Catalog(folder, tuple(files), tuple(cheapest_per_place(offers)))
