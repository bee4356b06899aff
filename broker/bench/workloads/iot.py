"""W-IoT: air-quality stations of a Madrid-like city, and subscriptions to their readings.

The city (stations, their names and districts) is fixed and never depends on the seed;
updates are hourly readings of 3 to 8 pollutants, and subscriptions a mix of per-station
alerts, district ranges, type-wide thresholds and text filters on station names.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from broker.bench.workloads._common import (
    IOT_SUBS,
    IOT_UPDATES,
    check_count,
    collector_paused,
    seeded_rng,
)
from broker.model.attribute import Attribute
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate

__all__ = [
    "DISTRICTS",
    "IOT_TENANT",
    "IOT_TYPE",
    "POLLUTANTS",
    "Pollutant",
    "Station",
    "iot_subscriptions",
    "iot_updates",
    "madrid_stations",
]

_CITY_SEED = 28079  # the Madrid municipality code; the city layout never depends on `seed`
_BASE_TIME = datetime(2024, 3, 1, tzinfo=UTC).timestamp()

IOT_TENANT = "madrid"
IOT_TYPE = "AirQualityObserved"
_IOT_ID_PREFIX = "urn:ngsi-ld:AirQualityObserved:"

DISTRICTS = (
    "Centro", "Arganzuela", "Retiro", "Salamanca", "Chamartin", "Tetuan", "Chamberi",
    "Fuencarral_El_Pardo", "Moncloa_Aravaca", "Latina", "Carabanchel", "Usera",
    "Puente_de_Vallecas", "Moratalaz", "Ciudad_Lineal", "Hortaleza", "Villaverde",
    "Villa_de_Vallecas", "Vicalvaro", "San_Blas_Canillejas", "Barajas",
)  # fmt: skip

# The 24 stations of Madrid's real network, with their districts; the rest are synthetic.
_REAL_STATIONS = (
    ("Plaza de España", "Moncloa_Aravaca"), ("Escuelas Aguirre", "Salamanca"),
    ("Avenida Ramón y Cajal", "Chamartin"), ("Arturo Soria", "Ciudad_Lineal"),
    ("Villaverde", "Villaverde"), ("Farolillo", "Carabanchel"),
    ("Casa de Campo", "Moncloa_Aravaca"), ("Barajas Pueblo", "Barajas"),
    ("Plaza del Carmen", "Centro"), ("Moratalaz", "Moratalaz"),
    ("Cuatro Caminos", "Chamberi"), ("Barrio del Pilar", "Fuencarral_El_Pardo"),
    ("Vallecas", "Puente_de_Vallecas"), ("Méndez Álvaro", "Arganzuela"),
    ("Castellana", "Chamartin"), ("Retiro", "Retiro"), ("Plaza Castilla", "Tetuan"),
    ("Ensanche de Vallecas", "Villa_de_Vallecas"), ("Urbanización Embajada", "Barajas"),
    ("Plaza Elíptica", "Usera"), ("Sanchinarro", "Hortaleza"),
    ("El Pardo", "Fuencarral_El_Pardo"), ("Juan Carlos I", "Barajas"),
    ("Tres Olivos", "Fuencarral_El_Pardo"),
)  # fmt: skip

# Synthetic names are "<kind> <place>", the kind drawn with these weights.
_NAME_KINDS = (
    ("Plaza", 0.25), ("Calle", 0.20), ("Avenida", 0.13), ("Paseo", 0.10), ("Parque", 0.09),
    ("Glorieta", 0.07), ("Colegio", 0.06), ("Barrio", 0.05), ("Ronda", 0.05),
)  # fmt: skip
_PLACES = (
    "de Castilla", "de Colón", "de Cibeles", "de Neptuno", "de Oriente", "de Lavapiés",
    "de Chueca", "de Tirso de Molina", "de Legazpi", "de Cuzco", "de Manuel Becerra",
    "de Quevedo", "de Olavide", "de Chamberí", "de Argüelles", "de Moncloa", "de Atocha",
    "de Embajadores", "de Toledo", "de Segovia", "de Alcalá", "de Goya", "de Velázquez",
    "de Serrano", "de Princesa", "de Bravo Murillo", "de Arturo Soria", "de Hortaleza",
    "de Fuencarral", "de Valverde", "de Aluche", "de Carabanchel", "de Usera", "de Orcasitas",
    "de Entrevías", "de Vicálvaro", "de Canillejas", "de Barajas", "de Pinar de Chamartín",
    "de Mirasierra", "de Peñagrande", "de Aravaca", "de Valdezarza", "de Tetuán",
    "de Ventas", "de Pueblo Nuevo", "de Simancas", "de San Blas", "de Coslada",
    "de Villaverde", "de Butarque", "de Orcasur", "de Marroquina", "de Fontarrón",
    "de Vinateros", "de Palomeras", "de Numancia", "de Santa Eugenia", "del Carmen",
    "del Pilar", "del Prado", "del Rey", "del Sol", "del Conde", "del Pozo",
    "del Angel", "de la Villa", "de la Ópera", "de la Paloma", "de la Ermita",
    "de la Estrella", "de la Elipa", "de la Concepción", "de la Guindalera",
    "de las Rosas", "de las Águilas", "de los Cármenes", "de los Rosales",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Pollutant:
    """One measured magnitude: values are lognormal(median, sigma), clipped to [0, high]."""

    name: str
    unit: str
    median: float
    sigma: float
    high: float
    decimals: int

    def quantile(self, p: float) -> float:
        """The value below which a fraction ``p`` of this pollutant's readings fall."""
        if p <= 0.0:
            return 0.0
        if p >= 1.0:
            return self.high
        value = self.median * math.exp(self.sigma * statistics.NormalDist().inv_cdf(p))
        return round(min(value, self.high), self.decimals)

    def literal(self, value: float) -> str:
        """``value`` as written in a filter, with this pollutant's decimals."""
        return f"{value:.{self.decimals}f}"


# Hourly readings as a Madrid station reports them (CO in mg/m3, the rest in µg/m3).
POLLUTANTS = (
    Pollutant("NO2", "µg/m3", 35.0, 0.6, 400.0, 1),
    Pollutant("O3", "µg/m3", 55.0, 0.5, 240.0, 1),
    Pollutant("PM10", "µg/m3", 20.0, 0.6, 300.0, 1),
    Pollutant("PM2_5", "µg/m3", 10.0, 0.6, 200.0, 1),
    Pollutant("SO2", "µg/m3", 5.0, 0.5, 100.0, 1),
    Pollutant("CO", "mg/m3", 0.4, 0.5, 10.0, 2),
    Pollutant("BEN", "µg/m3", 0.8, 0.6, 20.0, 2),
    Pollutant("TOL", "µg/m3", 3.0, 0.7, 60.0, 1),
)
_BY_NAME = {p.name: p for p in POLLUTANTS}


@dataclass(frozen=True, slots=True)
class Station:
    """One monitoring station: where it is and what it is called."""

    code: str
    entity_id: str
    name: str
    district: str
    service_path: str


@functools.lru_cache(maxsize=8)
def madrid_stations(stations: int = 1000) -> tuple[Station, ...]:
    """The fixed layout of a city of ``stations`` stations (independent of any seed).

    The first 24 are Madrid's real stations in their districts (one of them ``Retiro``);
    the others get unique synthetic names (a quarter start with ``Plaza``) and districts
    dealt round-robin in a fixed shuffled order, so districts stay about equal in size.
    """
    if stations < 1:
        raise ValueError(f"a city needs at least one station, got {stations}")
    rng = np.random.default_rng(_CITY_SEED)
    kinds = [k for k, _ in _NAME_KINDS]
    weights = np.array([w for _, w in _NAME_KINDS])
    order = rng.permutation(len(DISTRICTS))
    taken = {name for name, _ in _REAL_STATIONS}
    layout = list(_REAL_STATIONS[:stations])
    extra = stations - len(layout)
    kind_draws = rng.choice(len(kinds), size=max(extra, 0), p=weights / weights.sum())
    place_draws = rng.integers(0, len(_PLACES), size=max(extra, 0))
    for i in range(max(extra, 0)):
        base = f"{kinds[kind_draws[i]]} {_PLACES[place_draws[i]]}"
        name, copy = base, 1
        while name in taken:
            copy += 1
            name = f"{base} {copy}"
        taken.add(name)
        layout.append((name, DISTRICTS[order[i % len(DISTRICTS)]]))
    width = max(3, len(str(stations)))
    result = []
    for i, (name, district) in enumerate(layout):
        code = f"28079{i + 1:0{width}d}"
        result.append(
            Station(
                code=sys.intern(code),
                entity_id=sys.intern(_IOT_ID_PREFIX + code),
                name=sys.intern(name),
                district=district,
                service_path=sys.intern("/" + district),
            )
        )
    return tuple(result)


@collector_paused
def iot_updates(m: int, seed: int, stations: int = 1000) -> list[ContextUpdate]:
    """``m`` W-IoT updates: a uniform station, 3 to 8 of the 8 pollutants, a date and a name.

    Station ``i`` reports hourly: the k-th update of the list is dated
    2024-03-01T00:00Z plus ``k // stations`` hours.
    """
    check_count("m", m)
    city = madrid_stations(stations)
    rng = seeded_rng(seed, IOT_UPDATES)
    which = rng.integers(0, len(city), size=m).tolist()
    carried = rng.integers(3, len(POLLUTANTS) + 1, size=m).tolist()
    order = np.argsort(rng.random((m, len(POLLUTANTS))), axis=1).tolist()
    values = [
        np.round(
            np.clip(rng.lognormal(math.log(p.median), p.sigma, size=m), 0.0, p.high),
            p.decimals,
        ).tolist()
        for p in POLLUTANTS
    ]
    number = sys.intern("Number")
    names = [sys.intern(p.name) for p in POLLUTANTS]
    # Attributes are immutable: one per station name and one per hour, shared.
    station_names = [Attribute(sys.intern("Text"), s.name) for s in city]
    dates: dict[int, Attribute] = {}
    updates = []
    for k in range(m):
        station = city[which[k]]
        attributes = {
            names[j]: Attribute(number, values[j][k]) for j in sorted(order[k][: carried[k]])
        }
        hour = k // len(city)
        date = dates.get(hour)
        if date is None:
            stamp = datetime.fromtimestamp(_BASE_TIME + 3600 * hour, UTC)
            date = dates[hour] = Attribute("DateTime", stamp.strftime("%Y-%m-%dT%H:%M:%SZ"))
        attributes["dateObserved"] = date
        attributes["stationName"] = station_names[which[k]]
        updates.append(
            ContextUpdate(
                station.entity_id,
                attributes,
                entity_type=IOT_TYPE,
                tenant=IOT_TENANT,
                service_path=station.service_path,
                publisher="bench-iot",
                sequence=k + 1,
            )
        )
    return updates


# Kinds of W-IoT subscription and their shares (see docs/workloads.md for the reasoning).
_IOT_KINDS = (
    ("station_alert", 0.40),  # id + NO2>t (or PM10 / O3), t a high quantile
    ("district_range", 0.35),  # idPattern + /<district> + PM10==lo..hi
    ("type_threshold", 0.0495),  # type + O3>t, t a very high quantile
    ("type_exists", 0.0005),  # type + O3 (matches 69% of updates, so kept rare)
    ("name_equals", 0.10),  # stationName=='<a station name>'
    ("name_prefix", 0.05),  # stationName~=^Plaza;NO2>t
    ("name_word", 0.05),  # stationName~=<a place word>
)
_ALERT_POLLUTANTS = ("NO2", "NO2", "NO2", "PM10", "O3")
_RANGE_POLLUTANTS = ("PM10", "PM10", "PM2_5", "NO2", "O3")
# Grids: exceedance probabilities (log-spaced) and range masses / positions.
_ALERT_EXCEEDANCE = np.geomspace(0.01, 0.5, 24)
_TYPE_EXCEEDANCE = np.geomspace(0.002, 0.02, 12)
_PREFIX_EXCEEDANCE = np.geomspace(0.01, 0.1, 12)
_RANGE_MASS = np.linspace(0.05, 0.35, 7)
_RANGE_START = np.linspace(0.0, 0.95, 20)


@functools.lru_cache(maxsize=8)
def _name_words(stations: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The name kinds that start station names, and the place words found in them."""
    city = madrid_stations(stations)
    kinds = tuple(k for k, _ in _NAME_KINDS if any(s.name.startswith(k) for s in city))
    words = sorted(
        {p.split()[-1] for p in _PLACES if len(p.split()[-1]) > 3}
        & {w for s in city for w in s.name.split()}
    )
    return kinds, tuple(words)


def _above_table(pollutants: tuple[str, ...], exceedance: np.ndarray) -> list[list[str]]:
    """``P>t`` texts per pollutant, ``t`` exceeded by each fraction of readings in the grid."""
    table = []
    for name in pollutants:
        p = _BY_NAME[name]
        table.append(
            [sys.intern(f"{name}>{p.literal(p.quantile(1.0 - float(e)))}") for e in exceedance]
        )
    return table


def _range_table() -> list[list[str]]:
    """``P==lo..hi`` texts per range pollutant: every (mass, start) of the grids."""
    table = []
    for name in _RANGE_POLLUTANTS:
        p = _BY_NAME[name]
        row = []
        for start in _RANGE_START:
            for mass in _RANGE_MASS:
                low = min(float(start), 1.0 - float(mass))
                lo, hi = p.literal(p.quantile(low)), p.literal(p.quantile(low + float(mass)))
                row.append(sys.intern(f"{name}=={lo}..{hi}"))
        table.append(row)
    return table


@collector_paused
def iot_subscriptions(n: int, seed: int, stations: int = 1000) -> list[Subscription]:
    """``n`` W-IoT subscriptions, ids ``iot-<i>``, in the kind mix of ``_IOT_KINDS``.

    Thresholds are quantiles of each pollutant's distribution, so one update matches
    about 0.4% of the subscriptions (measured figures in docs/workloads.md).
    """
    check_count("n", n)
    city = madrid_stations(stations)
    kinds_of_names, place_words = _name_words(stations)
    rng = seeded_rng(seed, IOT_SUBS)
    shares = np.array([share for _, share in _IOT_KINDS])
    kind = rng.choice(len(_IOT_KINDS), size=n, p=shares / shares.sum()).tolist()
    pick = rng.integers(0, 1 << 30, size=(n, 3)).tolist()

    by_station = [
        (EntitySelector(id=s.entity_id, type=IOT_TYPE),) for s in city
    ]  # shared: one selector per station, not per subscription
    any_station = (EntitySelector(id_pattern="^" + _IOT_ID_PREFIX, type=IOT_TYPE),)
    all_of_type = (EntitySelector(id_pattern=".*", type=IOT_TYPE),)
    district_scopes = [sys.intern("/" + d) for d in DISTRICTS]

    alerts = _above_table(_ALERT_POLLUTANTS, _ALERT_EXCEEDANCE)
    type_thresholds = _above_table(("O3",), _TYPE_EXCEEDANCE)[0]
    prefix_thresholds = _above_table(("NO2",), _PREFIX_EXCEEDANCE)[0]
    ranges = _range_table()
    name_equals = [sys.intern(f"stationName=='{s.name}'") for s in city]
    subscriptions = []
    for i in range(n):
        a, b, c = pick[i]
        name = _IOT_KINDS[kind[i]][0]
        entities, scope = all_of_type, "/#"
        if name == "station_alert":
            entities = by_station[a % len(city)]
            row = alerts[b % len(alerts)]
            q = row[c % len(row)]
        elif name == "district_range":
            entities, scope = any_station, district_scopes[a % len(district_scopes)]
            row = ranges[b % len(ranges)]
            q = row[c % len(row)]
        elif name == "type_threshold":
            q = type_thresholds[c % len(type_thresholds)]
        elif name == "type_exists":
            q = "O3"
        elif name == "name_equals":
            q = name_equals[a % len(name_equals)]
        elif name == "name_prefix":
            prefix = kinds_of_names[a % len(kinds_of_names)]
            q = f"stationName~=^{prefix};{prefix_thresholds[c % len(prefix_thresholds)]}"
        else:  # name_word
            q = f"stationName~={place_words[a % len(place_words)]}"
        subscriptions.append(
            Subscription(
                id=f"iot-{i}",
                entities=entities,
                tenant=IOT_TENANT,
                service_path=scope,
                q=sys.intern(q),
                subscriber="bench",
                description=name,
            )
        )
    return subscriptions
