"""Why bwrap could not start: each kernel policy that refuses namespaces is named with its own fix."""

from __future__ import annotations

import pytest

from codemill.sandbox.binary import Bwrap, namespace_refusal

DEBIAN = ("bwrap: No permissions to creating new namespace, likely because the kernel does not allow "
          "non-privileged user namespaces. On e.g. debian this can be enabled with "
          "'sysctl kernel.unprivileged_userns_clone=1'.")
APPARMOR = "bwrap: setting up uid map: Permission denied"
CONTAINER = "bwrap: Creating new namespace failed: Operation not permitted"


@pytest.mark.parametrize(("stderr", "sysctls", "as_root", "cause", "fix"), [
    (DEBIAN, {"kernel.unprivileged_userns_clone": "0"}, False, "kernel.unprivileged_userns_clone=0",
     "sysctl -w kernel.unprivileged_userns_clone=1"),
    (APPARMOR, {"kernel.apparmor_restrict_unprivileged_userns": "1"}, False, "AppArmor",
     "kernel.apparmor_restrict_unprivileged_userns=0"),
    (CONTAINER, {}, True, "forbids new namespaces even to root", "--cap-add SYS_ADMIN"),
    (CONTAINER, {"user.max_user_namespaces": "0"}, False, "user.max_user_namespaces=0",
     "user.max_user_namespaces=15000"),
    # root creates no user namespace: that sysctl is not the cause, the container's missing privilege is
    (CONTAINER, {"user.max_user_namespaces": "0"}, True, "forbids new namespaces even to root",
     "--cap-add SYS_ADMIN"),
])
def test_each_refusal_names_its_cause_and_fix(stderr, sysctls, as_root, cause, fix):
    err = namespace_refusal(stderr, sysctls, as_root)
    assert err is not None
    assert cause in str(err) and str(err).startswith("the sandbox cannot start:")
    assert fix in (err.hint or "")
    assert "\n" not in str(err)


def test_other_failures_are_not_called_a_namespace_refusal():
    assert namespace_refusal("bwrap: execvp /nonexistent/python: No such file or directory", {}, False) is None
    assert namespace_refusal("", {"user.max_user_namespaces": "0"}, False) is None


def test_the_record_names_binary_origin_and_version():
    assert Bwrap("/usr/bin/bwrap", "system", "bubblewrap 0.8.0").record() == {
        "bwrap": "/usr/bin/bwrap", "bwrap_origin": "system", "bwrap_version": "bubblewrap 0.8.0"}
