"""W-text: prefix / suffix / contains / regex filters on four Text attributes.

Events are shops, vehicles, devices and points of interest with short realistic strings;
subscriptions test one attribute with one string operator, with operands taken from the
same vocabularies so that a test passes for a few percent of the events.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from broker.bench.workloads._common import (
    TEXT_SUBS,
    TEXT_UPDATES,
    check_count,
    collector_paused,
    seeded_rng,
)
from broker.model.attribute import Attribute
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate

__all__ = ["TEXT_ATTRIBUTES", "TEXT_TYPES", "text_subscriptions", "text_updates"]

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


@collector_paused
def text_updates(m: int, seed: int) -> list[ContextUpdate]:
    """``m`` W-text events: one of 4 types, all 4 Text attributes, realistic short strings.

    ``name`` is "<first> <second>" (48 x 48 words), ``category`` one of 40, ``address``
    "<kind> <street> <1..299>" (6 x 40 streets) and ``code`` "<city>-<4 hex digits>"
    (8 cities), each drawn uniformly.
    """
    check_count("m", m)
    rng = seeded_rng(seed, TEXT_UPDATES)
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


@collector_paused
def text_subscriptions(n: int, seed: int) -> list[Subscription]:
    """``n`` W-text subscriptions, ids ``text-<i>``: a type and one string test.

    Each has one entity selector ``idPattern .*`` with a type drawn from 4, and one
    prefix / suffix / contains / regex statement on one of the 4 Text attributes (drawn
    uniformly; prefix tests do not use ``address``). Operands come from the same vocabularies
    as :func:`text_updates`, sized so that a test passes for a few percent of the events.
    """
    check_count("n", n)
    rng = seeded_rng(seed, TEXT_SUBS)
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
