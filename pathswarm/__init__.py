"""pathswarm: federated peer-to-peer training of a DiPaCo modular language model.

The subpackages map the repository's top-level folders (see setup.cfg):
`pathswarm.node` (model, data, training, CLI), `pathswarm.protocol` (spec, records, hivemind),
`pathswarm.compression` (outer-gradient codec), `pathswarm.bootstrap` (swarm start-up).
"""

__version__ = "0.1.0"
