"""The outer round, one concern per file (docs/ARCHITECTURE.md has the map).

- `outer.py`: a module's state (`OuterState`: anchor, outer momentum, round, reducer list, digest) and the outer
  Nesterov step: what every replica must agree on.
- `merge.py` and `rule.py`: the round rule, pure: screening, the capped token-weighted robust mean, one
  canonical encoding, the state it makes; decoding and auditing a mean.
- `messages.py`: one typed class per stream message, and the round's status.
- `reducer.py`: the reducer's side, one `ReducerRound` per (module, round); `stance.py`: asking the earlier
  candidates first; `reducers.py`: who may reduce.
- `member.py`: the member's side: send, fail over, re-ask, check the reply.
- `service.py`: the request handlers and state downloads; `audit.py`: frames and alerts for audits;
  `trust.py`: admission, budgets, distrust.
- `exchange.py`: `ModuleExchange`, the facade the node uses.
"""
