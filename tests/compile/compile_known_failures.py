"""Known failures of the compile-mode OpInfo sweep (tests/compile/test_opinfo_compile.py):
op name[.variant] -> one-line reason, in the form of torch_pjrt/conformance_known_failures.py
(an unlisted failure fails the test; a listed op that passes every sample fails it too, until
its line is deleted). Eager's own known failures apply here as well."""

from torch_pjrt.conformance_known_failures import KNOWN_FAILURES as _EAGER

FORWARD: dict[str, str] = {
}

BACKWARD: dict[str, str] = {
}

KNOWN_FAILURES = {"forward": {**_EAGER["forward"], **FORWARD},
                  "backward": {**_EAGER["backward"], **BACKWARD}}
