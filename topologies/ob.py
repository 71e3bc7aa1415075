"""OB - Online Bidding: bids, price alterations and quantity top-ups on items (contract §3)."""

from __future__ import annotations

from txstream.topologies.api import (
    INT,
    INT_LIST,
    STRING,
    EventShare,
    Table,
    Topology,
    Transactions,
    condition,
)
from txstream.topologies.functions import MAX_VALUE, add, assign, covers, subtract

ITEMS = Table("items", ("price", "quantity"))


@condition
def bid_reaches_price(value, args, reads, n_reads):
    """The bid price is at least the item's price."""
    return args[0] >= value


def pre_process(events: EventShare) -> None:
    """Reject malformed bids, alterations and top-ups."""
    events.require_kind()
    events.require_present(["event_id"])
    bid, alter, top = events.kind("bid"), events.kind("alter"), events.kind("top")
    items, prices, quantities = (events.list(c).lengths for c in ("items", "prices", "quantities"))
    events.require_present(["items", "quantities", "bid_price"], where=bid)
    events.require_present(["items", "prices"], where=alter)
    events.require_present(["items", "quantities"], where=top)
    events.reject(bid & ((items != 1) | (quantities != 1)), "bid needs one item and one quantity")
    events.reject(alter & (items != prices), "list lengths differ")
    events.reject(top & (items != quantities), "list lengths differ")
    events.require_key("items", ITEMS, where=bid | alter | top)
    events.require_between("quantities", 1, MAX_VALUE, where=bid | top)
    events.require_between("bid_price", 1, MAX_VALUE, where=bid)
    events.require_between("prices", 1, MAX_VALUE, where=alter)


def state_access(events: EventShare, txn: Transactions) -> None:
    """A bid checks the price and takes the quantity; alter and top update every item listed."""
    price, quantity = ITEMS["price"], ITEMS["quantity"]
    bid, alter, top = events.kind("bid"), events.kind("alter"), events.kind("top")
    items, quantities = events.list("items"), events.list("quantities")
    txn.read(
        price,
        items,
        args=[events.int("bid_price")],
        where=bid,
        cond=bid_reaches_price,
        reason="bid below price",
    )
    txn.read_modify(
        quantity,
        items,
        subtract,
        args=[quantities],
        where=bid,
        cond=covers,
        reason="insufficient quantity",
    )
    txn.write(price, items, assign, args=[events.list("prices")], where=alter)
    txn.read_modify(quantity, items, add, args=[quantities], where=top)


def topology() -> Topology:
    """Build the OB topology."""
    return Topology(
        name="ob",
        tables=(ITEMS,),
        event_columns={
            "event_id": INT,
            "kind": STRING,
            "items": INT_LIST,
            "prices": INT_LIST,
            "quantities": INT_LIST,
            "bid_price": INT,
        },
        kinds=("bid", "alter", "top"),
        functions=(add, subtract, assign),
        conditions=(covers, bid_reaches_price),
        pre_process=pre_process,
        state_access=state_access,
    )
