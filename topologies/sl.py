"""SL - Streaming Ledger: deposits and transfers over accounts and assets (contract §3), of
dense keys or of natural ones, which a deposit or the destination of a transfer creates."""

from __future__ import annotations

from txstream.state.keys import DENSE
from txstream.state.keys import STRING as STRING_KEY
from txstream.topologies.api import INT, STRING, EventShare, Table, Topology, Transactions
from txstream.topologies.functions import MAX_VALUE, add, covers, subtract

ACCOUNTS = Table("accounts", ("balance",))
ASSETS = Table("assets", ("balance",))
KEY_COLUMNS = {
    "account": "accounts",
    "dst_account": "accounts",
    "asset": "assets",
    "dst_asset": "assets",
}


def pre_process(events: EventShare) -> None:
    """Reject malformed deposits and transfers."""
    accounts, assets = events.topology.tables
    events.require_kind()
    events.require_present(["event_id"])
    deposit, transfer = events.kind("deposit"), events.kind("transfer")
    both = deposit | transfer
    events.require_present(["account", "asset", "amount", "asset_amount"], where=both)
    events.require_present(["dst_account", "dst_asset"], where=transfer)
    events.require_key("account", accounts, where=both)
    events.require_key("asset", assets, where=both)
    events.require_key("dst_account", accounts, where=transfer)
    events.require_key("dst_asset", assets, where=transfer)
    events.require_between("amount", 1, MAX_VALUE, where=both)
    events.require_between("asset_amount", 1, MAX_VALUE, where=both)


def state_access(events: EventShare, txn: Transactions) -> None:
    """A deposit is two READ_MODIFYs; a transfer four, the debits conditional. Of natural
    keys, a deposit creates its account and asset first, a transfer its destinations (a
    missing source has balance 0: the transfer aborts)."""
    accounts, assets = events.topology.tables
    deposit, transfer = events.kind("deposit"), events.kind("transfer")
    account, asset = events.int("account"), events.int("asset")
    amount, asset_amount = events.int("amount"), events.int("asset_amount")
    balance, holding = accounts["balance"], assets["balance"]
    dst_account, dst_asset = events.int("dst_account"), events.int("dst_asset")
    if accounts.natural:
        txn.create(accounts, account, where=deposit)
        txn.create(assets, asset, where=deposit)

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
    if accounts.natural:
        txn.create(accounts, dst_account, where=transfer)
    txn.read_modify(balance, dst_account, add, args=[amount], where=transfer)
    txn.read_modify(
        holding,
        asset,
        subtract,
        args=[asset_amount],
        where=transfer,
        cond=covers,
        reason="insufficient assets",
    )
    if assets.natural:
        txn.create(assets, dst_asset, where=transfer)
    txn.read_modify(holding, dst_asset, add, args=[asset_amount], where=transfer)


def topology(key: str = DENSE) -> Topology:
    """Build the SL topology, its tables' keys of type ``key`` (`txstream.state.keys`)."""
    natural = key != DENSE
    tables = (
        (ACCOUNTS, ASSETS)
        if not natural
        else tuple(Table(t.name, t.columns, key=key) for t in (ACCOUNTS, ASSETS))
    )
    key_column = STRING if key == STRING_KEY else INT
    return Topology(
        name="sl",
        tables=tables,
        event_columns={
            "event_id": INT,
            "kind": STRING,
            "account": key_column,
            "asset": key_column,
            "dst_account": key_column,
            "dst_asset": key_column,
            "amount": INT,
            "asset_amount": INT,
        },
        key_columns=KEY_COLUMNS if natural else {},
        kinds=("deposit", "transfer"),
        functions=(add, subtract),
        conditions=(covers,),
        pre_process=pre_process,
        state_access=state_access,
    )
