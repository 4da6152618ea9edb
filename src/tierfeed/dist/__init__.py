"""Distributed: stage-in to node-local storage, one namespace over the job, sample exchange."""

from tierfeed.dist.comm import Comm
from tierfeed.dist.exchanger import ExchangeCounters, ExchangeOptions, Exchanger
from tierfeed.dist.holders import Holdings, chunk_holders
from tierfeed.dist.job import Namespace
from tierfeed.dist.namespace import NamespaceSource
from tierfeed.dist.pls import Scheduler
from tierfeed.dist.stage import StageReport, local_dir_for, stage

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
