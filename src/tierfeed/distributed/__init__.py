"""Distributed: stage-in to node-local storage, one namespace over the job, sample exchange."""

from tierfeed.distributed.comm import Comm
from tierfeed.distributed.exchanger import ExchangeCounters, ExchangeOptions, Exchanger
from tierfeed.distributed.holders import Holdings, chunk_holders
from tierfeed.distributed.job import Namespace
from tierfeed.distributed.namespace import NamespaceSource
from tierfeed.distributed.pls import Scheduler
from tierfeed.distributed.stage import StageReport, local_dir_for, stage

__all__ = [
    "Comm",
    "ExchangeCounters",
    "ExchangeOptions",
    "Exchanger",
    "Holdings",
    "Namespace",
    "NamespaceSource",
    "Scheduler",
    "StageReport",
    "chunk_holders",
    "local_dir_for",
    "stage",
]
