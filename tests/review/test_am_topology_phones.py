"""Review finding: a text final.mdl whose <ForPhones> lists a huge phone number
makes io/am_file._read_topology_text allocate ``max(phone) + 1`` int64 entries
(np.full for phone2idx): phone 2000000000 asks for 14.9 GiB and fails with a
MemoryError (or exhausts memory) instead of a FormatError."""

from __future__ import annotations

import subprocess
import sys

from tests.reference import REF, require_reference

_CHILD = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # never really take 15 GiB
from pynnet3.am import AcousticModel
from pynnet3.errors import PynnetError
data = open(sys.argv[1], "rb").read().replace(
    b"<ForPhones> \n1 \n</ForPhones>", b"<ForPhones> \n1 2000000000 \n</ForPhones>", 1)
try:
    AcousticModel.from_bytes(data)
    print("accepted")
except PynnetError as e:
    print("PynnetError", type(e).__name__)
except BaseException as e:
    print("OTHER", type(e).__name__)
"""


def test_huge_phone_number_is_a_format_error():
    require_reference()
    path = REF / "am" / "tdnn_relu_bn" / "final.mdl.txt"
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                         text=True, timeout=120).stdout.strip()
    assert out.startswith("PynnetError"), out
