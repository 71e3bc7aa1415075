"""Payments between accounts of string ids holding exact money (contract §3).

Table ``accounts(balance decimal(18,2))`` of string keys, which exist or not:

- ``deposit``: opens ``account`` if it does not exist, then adds ``amount``;
- ``transfer``: moves ``amount`` from ``account`` to ``dst_account``; aborted if the
  account does not exist (``no such account``), holds less (``insufficient balance``), or
  the destination does not exist, never opened or closed (``no such destination``);
- ``close``: removes ``account`` with its balance; aborted if it does not exist.

A balance past 18 digits aborts its event (``decimal overflow``).
"""

from __future__ import annotations

from txstream.topologies.api import INT, STRING, EventShare, Table, Topology, Transactions
from txstream.topologies.functions import add, covers, subtract

MONEY = "decimal(18,2)"
"""Balances and amounts: 16 digits of currency units and 2 of cents."""
KINDS = ("deposit", "transfer", "close")
ACCOUNTS = Table("accounts", ("balance",), key="string", deletes=True, types={"balance": MONEY})


def pre_process(events: EventShare) -> None:
    """Reject unknown kinds, null fields, empty ids, and amounts that are not positive
    cents."""
    events.require_kind()
    events.require_present(["event_id"])
    known = events.kind_codes() >= 0
    moving = events.kind("deposit") | events.kind("transfer")
    transfer = events.kind("transfer")
    events.require_present(["account"], where=known)
    events.require_present(["amount"], where=moving)
    events.require_present(["dst_account"], where=transfer)
    events.require_key("account", ACCOUNTS, where=known)
    events.require_key("dst_account", ACCOUNTS, where=transfer)
    events.require_decimal("amount", where=moving)
    events.require_between("amount", 1, None, where=moving)


def state_access(events: EventShare, txn: Transactions) -> None:
    """Each kind as the module docstring says, checks first."""
    balance = ACCOUNTS["balance"]
    account, dst, amount = events.int("account"), events.int("dst_account"), events.int("amount")
    deposit, transfer, close = events.kind("deposit"), events.kind("transfer"), events.kind("close")
    txn.create(ACCOUNTS, account, where=deposit)
    txn.read_modify(balance, account, add, args=[amount], where=deposit)
    txn.exists(ACCOUNTS, account, reason="no such account", where=transfer | close)
    txn.read_modify(
        balance,
        account,
        subtract,
        args=[amount],
        cond=covers,
        reason="insufficient balance",
        where=transfer,
    )
    txn.exists(ACCOUNTS, dst, reason="no such destination", where=transfer)
    txn.read_modify(balance, dst, add, args=[amount], where=transfer)
    txn.delete(ACCOUNTS, account, where=close)


def topology() -> Topology:
    """The payments topology."""
    return Topology(
        name="payments",
        tables=(ACCOUNTS,),
        event_columns={
            "event_id": INT,
            "kind": STRING,
            "account": STRING,
            "dst_account": STRING,
            "amount": MONEY,
        },
        kinds=KINDS,
        functions=(add, subtract),
        conditions=(covers,),
        key_columns={"account": "accounts", "dst_account": "accounts"},
        pre_process=pre_process,
        state_access=state_access,
    )
