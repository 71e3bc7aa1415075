"""SL - Streaming Ledger: deposits and transfers over accounts and assets (contract §3)."""

from __future__ import annotations

from txstream.topologies.api import INT, STRING, EventShare, Table, Topology, Transactions
from txstream.topologies.functions import MAX_VALUE, add, covers, subtract

ACCOUNTS = Table("accounts", ("balance",))
ASSETS = Table("assets", ("balance",))


def pre_process(events: EventShare) -> None:
    """Reject malformed deposits and transfers."""
    events.require_kind()
    events.require_present(["event_id"])
    deposit, transfer = events.kind("deposit"), events.kind("transfer")
    both = deposit | transfer
    events.require_present(["account", "asset", "amount", "asset_amount"], where=both)
    events.require_present(["dst_account", "dst_asset"], where=transfer)
    events.require_key("account", ACCOUNTS, where=both)
    events.require_key("asset", ASSETS, where=both)
    events.require_key("dst_account", ACCOUNTS, where=transfer)
    events.require_key("dst_asset", ASSETS, where=transfer)
    events.require_between("amount", 1, MAX_VALUE, where=both)
    events.require_between("asset_amount", 1, MAX_VALUE, where=both)


def state_access(events: EventShare, txn: Transactions) -> None:
    """A deposit is two READ_MODIFYs; a transfer four, the debits conditional."""
    deposit, transfer = events.kind("deposit"), events.kind("transfer")
    account, asset = events.int("account"), events.int("asset")
    amount, asset_amount = events.int("amount"), events.int("asset_amount")
    balance, holding = ACCOUNTS["balance"], ASSETS["balance"]

    txn.read_modify(balance, account, add, args=[amount], where=deposit)
    txn.read_modify(holding, asset, add, args=[asset_amount], where=deposit)

    # Both conditions are checked on the state before the transfer's writes: the
    # account debit comes first, and the asset debit touches another table.
    txn.read_modify(
        balance,
        account,
        subtract,
        args=[amount],
        where=transfer,
        cond=covers,
        reason="insufficient balance",
    )
    txn.read_modify(balance, events.int("dst_account"), add, args=[amount], where=transfer)
    txn.read_modify(
        holding,
        asset,
        subtract,
        args=[asset_amount],
        where=transfer,
        cond=covers,
        reason="insufficient assets",
    )
    txn.read_modify(holding, events.int("dst_asset"), add, args=[asset_amount], where=transfer)


def topology() -> Topology:
    """Build the SL topology."""
    return Topology(
        name="sl",
        tables=(ACCOUNTS, ASSETS),
        event_columns={
            "event_id": INT,
            "kind": STRING,
            "account": INT,
            "asset": INT,
            "dst_account": INT,
            "dst_asset": INT,
            "amount": INT,
            "asset_amount": INT,
        },
        kinds=("deposit", "transfer"),
        functions=(add, subtract),
        conditions=(covers,),
        pre_process=pre_process,
        state_access=state_access,
    )
