"""Option handling every command shares: -h and --help print the command's usage on stdout
and exit 0; an unknown option is one line on stderr that names it, the same words in every
command; an option given without its value says that, not that it is unknown."""
import pytest

from k3cli import K3, k3

pytestmark = pytest.mark.skipif(not K3.exists(), reason=f"{K3} not built")

COMMANDS = [[], ["version"], ["inspect"], ["quantize"], ["make-tiny"], ["moe"], ["bench"],
            ["bench", "moe"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "k3")
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_exits_0(cmd, flag):
    p = k3(*cmd, flag)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: k3"), p.stdout
    assert p.stderr == ""


@pytest.mark.parametrize("cmd", [["version"], ["make-tiny", "DIR"], ["bench", "moe"], ["inspect", "X"],
                                 ["moe", "-m", "X", "--layer", "1"], ["quantize", "X", "DIR"]],
                         ids=lambda c: c[0] if c[0] != "bench" else "bench moe")
def test_unknown_option_named(cmd, tmp_path):
    cmd = [str(tmp_path / "d") if a in ("DIR", "X") else a for a in cmd]
    p = k3(*cmd, "--bogus")
    assert p.returncode == 1
    name = "bench moe" if cmd[0] == "bench" else cmd[0]
    assert p.stderr.strip().splitlines()[-1] == f"k3 {name}: unknown option '--bogus' (see k3 {name} -h)", p.stderr
    assert p.stdout == ""
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("cmd,flag", [(["make-tiny", "DIR"], "-f"), (["make-tiny", "DIR"], "--preset"),
                                      (["make-tiny", "DIR"], "-s"), (["bench", "moe"], "--tokens"),
                                      (["bench", "moe"], "-m"), (["quantize", "X", "DIR"], "--to"),
                                      (["quantize", "X", "DIR"], "-t"), (["moe"], "--layer")])
def test_missing_value_is_not_unknown(cmd, flag, tmp_path):
    cmd = [str(tmp_path / "d") if a == "DIR" else a for a in cmd]
    p = k3(*cmd, flag)
    assert p.returncode == 1
    assert f"{flag}: missing value" in p.stderr and "unknown" not in p.stderr, p.stderr
    assert not (tmp_path / "d").exists()


def test_version_takes_no_argument():
    p = k3("version", "extra")
    assert p.returncode == 1 and "unexpected argument 'extra'" in p.stderr, p.stderr
    assert p.stdout == ""


def test_bench_experts_range_as_help_says():
    """-h gives --experts the range top-k (16) .. 896; one below it is refused before any
    weight is built."""
    assert "from the layer's top-k (16) to its 896" in k3("bench", "moe", "-h").stdout
    p = k3("bench", "moe", "--experts", "15", "--tokens", "1", "-r", "1")
    assert p.returncode == 1 and "fewer than top_k 16" in p.stderr, p.stderr
    assert p.stdout == ""
