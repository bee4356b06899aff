"""Deterministic generators for the benchmark workloads of workloads.md.

Three workloads, each a pair of generators ``<name>_subscriptions(n, seed)`` and
``<name>_updates(m, seed)``, registered in :data:`WORKLOADS`:

- **W-IoT** (``iot``): Madrid-like air-quality stations under tenant ``madrid``, one service
  path per district, a mix of per-station alerts, district ranges, type-wide and text filters.
- **W-dense** (``dense``): the academic matching workload (REIN, TAMA, OpIndex): 20 numeric
  attributes, ``k`` range predicates of width ``w`` per subscription.
- **W-text**: prefix / suffix / contains / regex filters on four Text attributes.

The same ``(n, seed)`` always gives the same subscriptions (and ``(m, seed)`` the same
updates): random draws come from numpy generators seeded by ``seed`` and a per-generator
stream number, so subscriptions and updates made with one seed are independent. Everything
that is not random by design (the city's stations, names and districts) is fixed. Thresholds
are drawn on small grids so that the distinct ``q`` texts stay few and the parser's cache
absorbs most of the parsing. docs/workloads.md describes the generators and their measured
selectivity.
"""

from __future__ import annotations

import functools
import gc
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar

import numpy as np

from broker.model.attribute import Attribute
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate

__all__ = [
    "DENSE_ATTRIBUTES",
    "DENSE_DOMAIN",
    "DISTRICTS",
    "IOT_TENANT",
    "IOT_TYPE",
    "POLLUTANTS",
    "TEXT_ATTRIBUTES",
    "TEXT_TYPES",
    "WORKLOADS",
    "Pollutant",
    "Station",
    "Workload",
    "dense_subscriptions",
    "dense_updates",
    "iot_subscriptions",
    "iot_updates",
    "madrid_stations",
    "text_subscriptions",
    "text_updates",
]

# Stream numbers: one per generator, so one seed gives independent draws for each.
_IOT_SUBS, _IOT_UPDATES, _DENSE_SUBS, _DENSE_UPDATES, _TEXT_SUBS, _TEXT_UPDATES = range(6)
_CITY_SEED = 28079  # the Madrid municipality code; the city layout never depends on `seed`
_BASE_TIME = datetime(2024, 3, 1, tzinfo=UTC).timestamp()

_P = ParamSpec("_P")
_T = TypeVar("_T")


def _rng(seed: int, stream: int) -> np.random.Generator:
    if seed < 0:
        raise ValueError(f"seed must not be negative, got {seed}")
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))


def _collector_paused(generate: Callable[_P, _T]) -> Callable[_P, _T]:
    """Run ``generate`` with the cyclic garbage collector paused: building a million acyclic
    objects otherwise triggers collections that rescan all built so far (2-4x slower)."""

    @functools.wraps(generate)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return generate(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return paused


def _check_count(what: str, count: int) -> None:
    if count < 0:
        raise ValueError(f"{what} must not be negative, got {count}")


# --------------------------------------------------------------------------------------
# W-IoT: city air quality

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


@_collector_paused
def iot_updates(m: int, seed: int, stations: int = 1000) -> list[ContextUpdate]:
    """``m`` W-IoT updates: a uniform station, 3 to 8 of the 8 pollutants, a date and a name.

    Station ``i`` reports hourly: the k-th update of the list is dated
    2024-03-01T00:00Z plus ``k // stations`` hours.
    """
    _check_count("m", m)
    city = madrid_stations(stations)
    rng = _rng(seed, _IOT_UPDATES)
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


@_collector_paused
def iot_subscriptions(n: int, seed: int, stations: int = 1000) -> list[Subscription]:
    """``n`` W-IoT subscriptions, ids ``iot-<i>``, in the kind mix of ``_IOT_KINDS``.

    Thresholds are quantiles of each pollutant's distribution, so one update matches
    about 0.4% of the subscriptions (measured figures in docs/workloads.md).
    """
    _check_count("n", n)
    city = madrid_stations(stations)
    kinds_of_names, place_words = _name_words(stations)
    rng = _rng(seed, _IOT_SUBS)
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


# --------------------------------------------------------------------------------------
# W-dense: the academic workload

DENSE_ATTRIBUTES = tuple(sys.intern(f"a{j}") for j in range(20))
DENSE_DOMAIN = 1_000_000


def _dense_attribute_weights(attrs: int, skew: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, attrs + 1, dtype=float) ** skew
    return np.asarray(weights / weights.sum())


def _skewed_unit(rng: np.random.Generator, shape: tuple[int, ...], skew: float) -> np.ndarray:
    """Uniform [0, 1) draws, or with ``skew`` > 0 ones bunched toward 0 (``u ** (1 + skew)``)."""
    draws = rng.random(shape)
    return np.asarray(draws if skew == 0.0 else draws ** (1.0 + skew))


@_collector_paused
def dense_subscriptions(
    n: int,
    seed: int,
    attrs: int = 20,
    k: int = 10,
    width: float = 0.5,
    skew: float = 0.0,
) -> list[Subscription]:
    """``n`` W-dense subscriptions, ids ``dense-<i>``: ``k`` ranges on distinct attributes.

    Each range ``aX==lo..hi`` is ``width * 1e6`` wide, with ``lo`` uniform in
    ``[0, (1 - width) * 1e6]`` (integers), so it lies inside the domain; a uniform value
    falls in it with probability ``width``, and an event matches ``width ** k`` of the
    subscriptions (1/1024 for the defaults). With ``skew`` > 0, attributes are chosen with
    Zipf weights ``1 / rank ** skew`` and range positions bunch toward 0 like the values
    of :func:`dense_updates` with the same skew.
    """
    _check_count("n", n)
    if not 1 <= k <= attrs <= len(DENSE_ATTRIBUTES):
        raise ValueError(
            f"need 1 <= k <= attrs <= {len(DENSE_ATTRIBUTES)}, got k={k} attrs={attrs}"
        )
    if not 0.0 < width <= 1.0:
        raise ValueError(f"width must be in (0, 1], got {width}")
    rng = _rng(seed, _DENSE_SUBS)
    span = round(width * DENSE_DOMAIN)
    keys = rng.random((n, attrs))
    if skew > 0.0:  # Efraimidis-Spirakis: weighted sampling without replacement
        keys = np.log(keys) / _dense_attribute_weights(attrs, skew)
    chosen = np.sort(np.argsort(-keys, axis=1)[:, :k], axis=1).tolist()
    lows = np.floor(_skewed_unit(rng, (n, k), skew) * (DENSE_DOMAIN - span + 1)).astype(np.int64)
    lows_list = lows.tolist()
    everything = (EntitySelector(id_pattern=".*"),)
    subscriptions = []
    for i in range(n):
        q = ";".join(
            f"{DENSE_ATTRIBUTES[a]}=={lo}..{lo + span}"
            for a, lo in zip(chosen[i], lows_list[i], strict=True)
        )
        subscriptions.append(
            Subscription(id=f"dense-{i}", entities=everything, q=q, subscriber="bench")
        )
    return subscriptions


@_collector_paused
def dense_updates(m: int, seed: int, attrs: int = 20, skew: float = 0.0) -> list[ContextUpdate]:
    """``m`` W-dense events: entity ``urn:ngsi-ld:Event:<k>`` carrying all ``attrs`` values.

    Values are uniform in [0, 1e6) (with ``skew`` > 0: ``1e6 * u ** (1 + skew)``).
    """
    _check_count("m", m)
    rng = _rng(seed, _DENSE_UPDATES)
    values = (_skewed_unit(rng, (m, attrs), skew) * DENSE_DOMAIN).tolist()
    number = sys.intern("Number")
    names = DENSE_ATTRIBUTES[:attrs]
    return [
        ContextUpdate(
            f"urn:ngsi-ld:Event:{k}",
            {name: Attribute(number, v) for name, v in zip(names, values[k], strict=True)},
            entity_type="Event",
            publisher="bench-dense",
            sequence=k + 1,
        )
        for k in range(m)
    ]


# --------------------------------------------------------------------------------------
# W-text: string operators

TEXT_TYPES = ("Shop", "Vehicle", "Device", "PointOfInterest")
TEXT_ATTRIBUTES = ("name", "category", "address", "code")
_TEXT_ENTITIES = 20_000  # entity ids per type

_FIRST_WORDS = (
    "Blue", "Red", "Green", "Golden", "Silver", "Casa", "Café", "Bar", "Hotel", "Hostal",
    "Bodega", "Taberna", "Mercado", "Farmacia", "Librería", "Panadería", "Zapatería",
    "Floristería", "Ferretería", "Óptica", "Clínica", "Gimnasio", "Estudio", "Taller",
    "Garaje", "Kiosko", "Galería", "Museo", "Teatro", "Cine", "Sala", "Club", "Centro",
    "Espacio", "Mundo", "Punto", "Urban", "Smart", "Eco", "Nova", "Prime", "Metro", "Alpha",
    "Delta", "Omega", "Sol", "Luna", "Vega",
)  # fmt: skip
_SECOND_WORDS = (
    "Norte", "Sur", "Central", "Real", "Mayor", "Nuevo", "Verde", "Azul", "Alegre", "Moderno",
    "Express", "Plus", "Madrid", "Sevilla", "Toledo", "Segovia", "Aranjuez", "Alcalá", "Goya",
    "Velázquez", "Serrano", "Princesa", "Atocha", "Prado", "Retiro", "Ópera", "Latina",
    "Lavapiés", "Malasaña", "Chueca", "Salamanca", "Chamberí", "Tetuán", "Arganzuela",
    "Moncloa", "Hortaleza", "Vallecas", "Usera", "Carabanchel", "Barajas", "Vicálvaro",
    "Fuencarral", "Argüelles", "Embajadores", "Cibeles", "Colón", "Neptuno", "Castilla",
)  # fmt: skip
_CATEGORIES = (
    "bakery", "pharmacy", "bookshop", "grocery", "brewery", "bistro", "cafe", "restaurant",
    "hotel", "hostel", "museum", "theatre", "cinema", "gallery", "gym", "clinic", "garage",
    "parking", "charging-station", "bike-station", "scooter", "taxi", "bus", "tram",
    "delivery-van", "truck", "air-sensor", "noise-sensor", "water-meter", "power-meter",
    "smart-light", "traffic-camera", "weather-station", "waste-container", "kiosk", "market",
    "supermarket", "bank", "atm", "post-office",
)  # fmt: skip
_STREET_KINDS = ("Calle de", "Avenida de", "Paseo de", "Plaza de", "Ronda de", "Camino de")
_STREETS = (
    "Alcalá", "Atocha", "Bravo Murillo", "Serrano", "Goya", "Princesa", "la Castellana",
    "Toledo", "Segovia", "Embajadores", "Arturo Soria", "López de Hoyos", "Fuencarral",
    "Hortaleza", "Génova", "Velázquez", "Príncipe de Vergara", "Santa Engracia", "Ferraz",
    "Argumosa", "Alberto Aguilera", "Cea Bermúdez", "Raimundo Fernández Villaverde",
    "Francisco Silvela", "Doctor Esquerdo", "Marqués de Vadillo", "Oporto", "Valencia",
    "Andalucía", "Extremadura", "Aragón", "Burgos", "Guadalajara", "Badajoz", "Pontevedra",
    "Ciudad Lineal", "Mayor", "Arenal", "Preciados", "Montera",
)  # fmt: skip
_CITY_CODES = ("MAD", "BCN", "VLC", "SVQ", "BIO", "ZAZ", "AGP", "PMI")
_HEX = "0123456789ABCDEF"
_MAX_HOUSE_NUMBER = 299


@_collector_paused
def text_updates(m: int, seed: int) -> list[ContextUpdate]:
    """``m`` W-text events: one of 4 types, all 4 Text attributes, realistic short strings.

    ``name`` is "<first> <second>" (48 x 48 words), ``category`` one of 40, ``address``
    "<kind> <street> <1..299>" (6 x 40 streets) and ``code`` "<city>-<4 hex digits>"
    (8 cities), each drawn uniformly.
    """
    _check_count("m", m)
    rng = _rng(seed, _TEXT_UPDATES)
    draws = rng.integers(0, 1 << 30, size=(m, 9)).tolist()
    text = sys.intern("Text")
    updates = []
    for k in range(m):
        t, n1, n2, cat, sk, st, num, city, hexes = draws[k]
        entity_type = TEXT_TYPES[t % len(TEXT_TYPES)]
        code = "".join(_HEX[(hexes >> (4 * j)) & 15] for j in range(4))
        values = (
            f"{_FIRST_WORDS[n1 % len(_FIRST_WORDS)]} {_SECOND_WORDS[n2 % len(_SECOND_WORDS)]}",
            _CATEGORIES[cat % len(_CATEGORIES)],
            f"{_STREET_KINDS[sk % len(_STREET_KINDS)]} {_STREETS[st % len(_STREETS)]} "
            f"{1 + num % _MAX_HOUSE_NUMBER}",
            f"{_CITY_CODES[city % len(_CITY_CODES)]}-{code}",
        )
        updates.append(
            ContextUpdate(
                f"urn:ngsi-ld:{entity_type}:{hexes % _TEXT_ENTITIES}",
                {n: Attribute(text, v) for n, v in zip(TEXT_ATTRIBUTES, values, strict=True)},
                entity_type=entity_type,
                publisher="bench-text",
                sequence=k + 1,
            )
        )
    return updates


def _cut(word: str, draw: int, shortest: int) -> int:
    """A length in [min(shortest, len(word)), len(word)], picked by ``draw``."""
    low = min(shortest, len(word))
    return low + draw % (len(word) - low + 1)


def _text_prefix(attr: int, a: int, b: int) -> str:
    if attr == 0:
        word = _FIRST_WORDS[a % len(_FIRST_WORDS)]
        return f"name=^{word[: _cut(word, b, 3)]}"
    if attr == 1:
        word = _CATEGORIES[a % len(_CATEGORIES)]
        return f"category=^{word[: _cut(word, b, 3)]}"
    return f"code=^{_CITY_CODES[a % len(_CITY_CODES)]}-{_HEX[b % 16]}"


def _text_suffix(attr: int, a: int, b: int) -> str:
    if attr == 0:
        word = _SECOND_WORDS[a % len(_SECOND_WORDS)]
        return f"name=${word[-_cut(word, b, 3) :]}"
    if attr == 1:
        word = _CATEGORIES[a % len(_CATEGORIES)]
        return f"category=${word[-_cut(word, b, 4) :]}"
    if attr == 2:
        return f"address=${10 + a % 90}"  # two digits: ends 'x42' or ' 42'
    return f"code=${_HEX[a % 16]}{_HEX[b % 16]}"


def _text_contains(attr: int, a: int, b: int) -> str:
    if attr == 0:
        word = _SECOND_WORDS[a % len(_SECOND_WORDS)]
    elif attr == 1:
        word = _CATEGORIES[a % len(_CATEGORIES)]
    elif attr == 2:
        word = _STREETS[a % len(_STREETS)].split()[-1]
    else:
        return f"code=*{_HEX[a % 16]}{_HEX[b % 16]}{_HEX[(b >> 4) % 16]}"
    size = min(len(word), 4 + b % 2)
    start = (b >> 1) % (len(word) - size + 1)
    return f"{TEXT_ATTRIBUTES[attr]}=*{word[start : start + size]}"


def _text_regex(attr: int, a: int, b: int) -> str:
    if attr == 0:
        one, two = _FIRST_WORDS[a % len(_FIRST_WORDS)], _FIRST_WORDS[b % len(_FIRST_WORDS)]
        return f"name~=^({one}|{two})"
    if attr == 1:
        one, two = _CATEGORIES[a % len(_CATEGORIES)], _CATEGORIES[b % len(_CATEGORIES)]
        return f"category~=^({one}|{two})$"
    if attr == 2:
        one = _STREETS[a % len(_STREETS)].split()[-1]
        return f"address~={one} [0-9]?[0-9]$"
    return f"code~=^{_CITY_CODES[a % len(_CITY_CODES)]}-[0-9]{{2}}"


# Operators and their shares: prefix 30%, suffix 25%, contains 25%, regex 20%.
_TEXT_OPERATORS: tuple[tuple[Callable[[int, int, int], str], float], ...] = (
    (_text_prefix, 0.30),
    (_text_suffix, 0.25),
    (_text_contains, 0.25),
    (_text_regex, 0.20),
)


@_collector_paused
def text_subscriptions(n: int, seed: int) -> list[Subscription]:
    """``n`` W-text subscriptions, ids ``text-<i>``: a type and one string test.

    Each has one entity selector ``idPattern .*`` with a type drawn from 4, and one
    prefix / suffix / contains / regex statement on one of the 4 Text attributes (drawn
    uniformly; prefix tests do not use ``address``). Operands come from the same vocabularies
    as :func:`text_updates`, sized so that a test passes for a few percent of the events.
    """
    _check_count("n", n)
    rng = _rng(seed, _TEXT_SUBS)
    shares = np.array([share for _, share in _TEXT_OPERATORS])
    operator = rng.choice(len(_TEXT_OPERATORS), size=n, p=shares / shares.sum()).tolist()
    draws = rng.integers(0, 1 << 30, size=(n, 4)).tolist()
    selectors = {t: (EntitySelector(id_pattern=".*", type=t),) for t in TEXT_TYPES}
    subscriptions = []
    for i in range(n):
        t, attr, a, b = draws[i]
        build = _TEXT_OPERATORS[operator[i]][0]
        attr %= 3 if build is _text_prefix else 4
        subscriptions.append(
            Subscription(
                id=f"text-{i}",
                entities=selectors[TEXT_TYPES[t % len(TEXT_TYPES)]],
                q=sys.intern(build(attr, a, b)),
                subscriber="bench",
            )
        )
    return subscriptions


# --------------------------------------------------------------------------------------
# The registry


@dataclass(frozen=True, slots=True)
class Workload:
    """One named workload: how to make its subscriptions and updates, and its defaults."""

    name: str
    title: str
    subscriptions: Callable[[int, int], list[Subscription]]
    updates: Callable[[int, int], list[ContextUpdate]]
    default_updates: int


WORKLOADS: dict[str, Workload] = {
    "iot": Workload("iot", "W-IoT: city air quality", iot_subscriptions, iot_updates, 20_000),
    "dense": Workload(
        "dense",
        "W-dense: 20 numeric attributes, k=10, w=0.5",
        dense_subscriptions,
        dense_updates,
        2_000,
    ),
    "text": Workload("text", "W-text: string operators", text_subscriptions, text_updates, 20_000),
}
