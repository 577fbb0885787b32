"""Admission: which keys a training batch lets into its tables.

A table is configured with an ``AdmissionStrategy``
(``DynamicEmbTableOptions.admit_strategy``); the module fusing tables turns
their strategies into one ``MultiTableAdmitter`` (``create_admitter``), which
decides for the keys a batch misses. dynamicemb provides two pairs:

* ``FrequencyAdmissionStrategy`` -> ``MultiTableFrequencyAdmitter``: admits a
  key once it was seen ``threshold`` times, counting into a
  ``MultiTableKVCounter`` fused from the tables' ``KVCounter`` shares;
* ``ProbabilisticAdmissionStrategy`` -> ``MultiTableProbabilisticAdmitter``: a
  coin toss per occurrence, no state.

The interfaces (``Counter``, ``KVCounter``, ``AdmissionStrategy``,
``MultiTableAdmitter``) live in ``dynamicemb.types``; all of them are
importable from ``dynamicemb`` too. A module counts the keys its admitter
admits and rejects, per table, in its ``stats``
(``dynamicemb.storage.stats.StatCol.ADMISSIONS`` / ``REJECTIONS``).
"""

from dynamicemb.admission.admitters import (
    MultiTableFrequencyAdmitter,
    MultiTableProbabilisticAdmitter,
)
from dynamicemb.admission.counters import MultiTableKVCounter
from dynamicemb.admission.strategies import (
    DEFAULT_KV_COUNTER,
    FrequencyAdmissionStrategy,
    ProbabilisticAdmissionStrategy,
)
from dynamicemb.types import (
    AdmissionStrategy,
    Counter,
    KVCounter,
    MultiTableAdmitter,
)

__all__ = [
    "DEFAULT_KV_COUNTER",
    "AdmissionStrategy",
    "Counter",
    "FrequencyAdmissionStrategy",
    "KVCounter",
    "MultiTableAdmitter",
    "MultiTableFrequencyAdmitter",
    "MultiTableKVCounter",
    "MultiTableProbabilisticAdmitter",
    "ProbabilisticAdmissionStrategy",
]
