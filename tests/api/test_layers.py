"""Issue #16: Lambda layers through boto3, as a deployment tool uses them:
PublishLayerVersion, GetLayerVersion(ByArn), ListLayerVersions, ListLayers,
DeleteLayerVersion, and a function's Layers extracted under /opt in order (Python
finds /opt/python, Node /opt/nodejs/node_modules), changed with
UpdateFunctionConfiguration and kept across UpdateFunctionCode."""

import base64
import hashlib
import subprocess
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from thaw_node_harness import create, invoke_json, wait_updated, zip_bytes

USES_LAYERS = """
import os

def handler(event, context):
    try:
        import shared
        who = shared.WHO
    except ImportError:
        who = None
    try:
        import only_a
        a = only_a.A
    except ImportError:
        a = None
    try:
        open("/opt/new", "w")
        writable = True
    except OSError:
        writable = False
    return {"who": who, "a": a, "opt": sorted(os.listdir("/opt")), "writable": writable,
            "tool": open("/opt/bin/tool").read() if os.path.exists("/opt/bin/tool") else None}
"""


def code(e):
    return e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def publish(client, name, files, **kw):
    z = zip_bytes(files)
    r = client.publish_layer_version(LayerName=name, Content={"ZipFile": z}, **kw)
    assert r["ResponseMetadata"]["HTTPStatusCode"] == 201
    assert r["Content"]["CodeSha256"] == base64.b64encode(hashlib.sha256(z).digest()).decode()
    assert r["Content"]["CodeSize"] == len(z)
    return r


def test_layer_versions_are_published_listed_and_deleted(client):
    v1 = publish(client, "utils", {"python/util.py": "VALUE = 'one'\n"}, Description="first",
                 CompatibleRuntimes=["python3.12"], LicenseInfo="MIT")
    v2 = publish(client, "utils", {"python/util.py": "VALUE = 'two'\n"}, CompatibleRuntimes=["python3.12"])
    assert (v1["Version"], v2["Version"]) == (1, 2)
    assert v1["LayerArn"].endswith(":layer:utils") and v1["LayerVersionArn"] == v1["LayerArn"] + ":1"
    assert (v1["Description"], v1["LicenseInfo"], v1["CompatibleRuntimes"]) == ("first", "MIT", ["python3.12"])

    got = client.get_layer_version(LayerName="utils", VersionNumber=1)
    assert (got["Version"], got["Description"], got["Content"]["CodeSha256"]) == (1, "first", v1["Content"]["CodeSha256"])
    by_arn = client.get_layer_version_by_arn(Arn=v2["LayerVersionArn"])
    assert by_arn["Version"] == 2
    assert client.get_layer_version(LayerName=v1["LayerArn"], VersionNumber=2)["Version"] == 2, "a layer ARN names it too"

    assert [v["Version"] for v in client.list_layer_versions(LayerName="utils")["LayerVersions"]] == [2, 1]
    layers = {l["LayerName"]: l for l in client.list_layers()["Layers"]}
    assert layers["utils"]["LatestMatchingVersion"]["Version"] == 2
    assert "utils" not in {l["LayerName"] for l in client.list_layers(CompatibleRuntime="nodejs20.x")["Layers"]}

    client.delete_layer_version(LayerName="utils", VersionNumber=2)
    assert [v["Version"] for v in client.list_layer_versions(LayerName="utils")["LayerVersions"]] == [1]
    with pytest.raises(ClientError) as e:
        client.get_layer_version(LayerName="utils", VersionNumber=2)
    assert code(e) == ("ResourceNotFoundException", 404)
    client.delete_layer_version(LayerName="utils", VersionNumber=2)  # again: succeeds, as in Lambda
    assert publish(client, "utils", {"python/util.py": "VALUE = 3\n"})["Version"] == 3, "a number is never reused"
    assert client.list_layer_versions(LayerName="never-published")["LayerVersions"] == []


def test_layer_listings_page_and_filter(client):
    for i in range(3):
        publish(client, "paged", {"python/p.py": f"N = {i}\n"}, CompatibleArchitectures=["arm64"] if i == 1 else ["x86_64"])
    first = client.list_layer_versions(LayerName="paged", MaxItems=2)
    assert [v["Version"] for v in first["LayerVersions"]] == [3, 2] and first["NextMarker"]
    rest = client.list_layer_versions(LayerName="paged", MaxItems=2, Marker=first["NextMarker"])
    assert [v["Version"] for v in rest["LayerVersions"]] == [1] and "NextMarker" not in rest
    pages = client.get_paginator("list_layer_versions").paginate(LayerName="paged", PaginationConfig={"PageSize": 1})
    assert [v["Version"] for p in pages for v in p["LayerVersions"]] == [3, 2, 1]
    arm = client.list_layer_versions(LayerName="paged", CompatibleArchitecture="arm64")["LayerVersions"]
    assert [v["Version"] for v in arm] == [2]
    latest_arm = {l["LayerName"]: l["LatestMatchingVersion"]["Version"] for l in client.list_layers(CompatibleArchitecture="arm64")["Layers"]}
    assert latest_arm == {"paged": 2}, "the newest version that matches"
    names = [l["LayerName"] for p in client.get_paginator("list_layers").paginate(PaginationConfig={"PageSize": 1}) for l in p["Layers"]]
    assert "paged" in names and len(names) == len(set(names))
    with pytest.raises(ClientError) as e:
        client.list_layer_versions(LayerName="paged", Marker="nonsense")
    assert code(e) == ("InvalidParameterValueException", 400)


def test_functions_see_their_layers_under_opt_in_order(client):
    a = publish(client, "libs-a", {"python/shared.py": "WHO = 'a'\n", "python/only_a.py": "A = True\n",
                                   "bin/tool": "from a\n"})["LayerVersionArn"]
    b = publish(client, "libs-b", {"python/shared.py": "WHO = 'b'\n"})["LayerVersionArn"]
    create(client, "layered", zip_bytes({"handler.py": USES_LAYERS}), Layers=[a, b])
    _, out = invoke_json(client, "layered")
    assert out == {"who": "b", "a": True, "opt": ["bin", "python"], "writable": False, "tool": "from a\n"}, \
        "a later layer replaces an earlier one's files; /opt is read-only"
    cfg = client.get_function(FunctionName="layered")["Configuration"]
    assert [l["Arn"] for l in cfg["Layers"]] == [a, b]
    assert all(l["CodeSize"] > 0 for l in cfg["Layers"])

    # Reordered: a comes last and wins; the change rebuilds the snapshot.
    r = client.update_function_configuration(FunctionName="layered", Layers=[b, a])
    assert r["LastUpdateStatus"] == "InProgress"
    assert wait_updated(client, "layered")["LastUpdateStatus"] == "Successful"
    assert invoke_json(client, "layered")[1]["who"] == "a"

    # A published version keeps its layers.
    v = client.publish_version(FunctionName="layered")["Version"]

    # A deleted layer version stays with the functions using it, and new code keeps the layers.
    client.delete_layer_version(LayerName="libs-a", VersionNumber=1)
    client.update_function_code(FunctionName="layered", ZipFile=zip_bytes({"handler.py": USES_LAYERS + "\n# v2\n"}))
    assert wait_updated(client, "layered")["LastUpdateStatus"] == "Successful"
    assert invoke_json(client, "layered")[1]["who"] == "a"
    assert [l["Arn"] for l in client.get_function(FunctionName="layered", Qualifier=v)["Configuration"]["Layers"]] == [b, a]

    # No layers: /opt is gone, and so is the module.
    client.update_function_configuration(FunctionName="layered", Layers=[])
    assert wait_updated(client, "layered")["LastUpdateStatus"] == "Successful"
    assert invoke_json(client, "layered")[1] == {"who": None, "a": None, "opt": [], "writable": False, "tool": None}
    assert "Layers" not in client.get_function_configuration(FunctionName="layered")
    client.delete_function(FunctionName="layered")


def test_node_functions_find_layer_modules(client):
    arn = publish(client, "greeting", {"nodejs/node_modules/greet/index.js": "exports.greet = (n) => `hi ${n}`;\n"},
                  CompatibleRuntimes=["nodejs20.x"])["LayerVersionArn"]
    handler = "const { greet } = require('greet');\nexports.handler = async (e) => ({ msg: greet(e.name) });\n"
    create(client, "node-layered", zip_bytes({"index.js": handler}), handler="index.handler", Runtime="nodejs20.x",
           Layers=[arn])
    assert invoke_json(client, "node-layered", {"name": "thaw"})[1] == {"msg": "hi thaw"}
    client.delete_function(FunctionName="node-layered")


def test_bad_layers_are_refused_and_change_nothing(client):
    ok = publish(client, "valid", {"python/shared.py": "WHO = 'v'\n"})["LayerVersionArn"]
    base = ok.rsplit(":", 2)[0]
    missing = base + ":no-such-layer:1"
    cases = [
        ([missing], "does not exist"),
        ([ok.rsplit(":", 1)[0] + ":9"], "does not exist"),
        ([ok] * 6, "less than or equal to 5"),
        ([ok, ok.rsplit(":", 1)[0] + ":2"], "same layer"),
        (["not-an-arn"], "regular expression"),
    ]
    for layers, msg in cases:
        with pytest.raises(ClientError) as e:
            create(client, "bad-layers", zip_bytes({"handler.py": USES_LAYERS}), Layers=layers, wait=False)
        assert code(e) == ("InvalidParameterValueException", 400), layers
        assert msg in e.value.response["Error"]["Message"], e.value.response
        with pytest.raises(ClientError) as e:
            client.get_function(FunctionName="bad-layers")
        assert code(e)[0] == "ResourceNotFoundException", "a refused create leaves no function"

    create(client, "fine", zip_bytes({"handler.py": USES_LAYERS}), Layers=[ok])
    with pytest.raises(ClientError) as e:
        client.update_function_configuration(FunctionName="fine", Layers=[missing])
    assert code(e) == ("InvalidParameterValueException", 400)
    cfg = client.get_function_configuration(FunctionName="fine")
    assert ([l["Arn"] for l in cfg["Layers"]], cfg["LastUpdateStatus"]) == ([ok], "Successful"), "nothing changed"
    assert invoke_json(client, "fine")[1]["who"] == "v"
    client.delete_function(FunctionName="fine")

    with pytest.raises(ClientError) as e:
        client.publish_layer_version(LayerName="broken", Content={"ZipFile": b"not a zip"})
    assert code(e) == ("InvalidParameterValueException", 400)
    assert client.list_layer_versions(LayerName="broken")["LayerVersions"] == []
    with pytest.raises(ClientError) as e:
        client.get_layer_version(LayerName="no-such-layer", VersionNumber=1)
    assert code(e) == ("ResourceNotFoundException", 404)


JAVAC = Path("/usr/lib/jvm/java-17-openjdk-amd64/bin")


@pytest.mark.skipif(not (JAVAC / "javac").exists(), reason="no JDK 17 (scripts/setup.sh installs it)")
def test_java_functions_find_layer_jars(client, tmp_path):
    """A jar in a layer's java/lib is on the classpath, after the function's own code."""
    (tmp_path / "layer/src/layerlib").mkdir(parents=True)
    (tmp_path / "layer/src/layerlib/Greeter.java").write_text(
        "package layerlib;\npublic class Greeter { public static String greet(String n) { return \"hi \" + n + \" from a jar in /opt\"; } }\n")
    (tmp_path / "fn/src/example").mkdir(parents=True)
    (tmp_path / "fn/src/example/UsesLayer.java").write_text(
        "package example;\nimport java.util.Map;\n"
        "public class UsesLayer { public String handle(Map<String, Object> e) { return layerlib.Greeter.greet((String) e.get(\"name\")); } }\n")
    run = lambda *a: subprocess.run([str(x) for x in a], check=True, capture_output=True, timeout=120)
    run(JAVAC / "javac", "--release", "17", "-d", tmp_path / "layer/classes", tmp_path / "layer/src/layerlib/Greeter.java")
    run(JAVAC / "jar", "cf", tmp_path / "greeter.jar", "-C", tmp_path / "layer/classes", ".")
    run(JAVAC / "javac", "--release", "17", "-cp", tmp_path / "greeter.jar", "-d", tmp_path / "fn/classes",
        tmp_path / "fn/src/example/UsesLayer.java")
    arn = publish(client, "java-greeter", {"java/lib/greeter.jar": tmp_path / "greeter.jar"})["LayerVersionArn"]
    create(client, "java-layered", zip_bytes({"example/UsesLayer.class": tmp_path / "fn/classes/example/UsesLayer.class"}),
           handler="example.UsesLayer::handle", Runtime="java17", Layers=[arn])
    assert invoke_json(client, "java-layered", {"name": "thaw"})[1] == "hi thaw from a jar in /opt"
    client.delete_function(FunctionName="java-layered")
