"""Issue #16: function URLs. The configuration through boto3 (create, get, update,
list, delete, conflicts), then plain HTTP requests to the URL: the function receives
an HTTP API payload 2.0 event and its result becomes the HTTP answer; AWS_IAM URLs
require a SigV4 signature; CORS preflights are answered and CORS headers added."""

import base64
import json
import subprocess
import urllib.error
import urllib.request

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from thaw_node_harness import ACCESS_KEY, SECRET_KEY, create, zip_bytes

WEB = """
import base64, json

def handler(event, context):
    if event.get("rawPath") == "/plain":
        return {"just": "json"}
    body = event.get("body")
    if body is not None and event.get("isBase64Encoded"):
        body = base64.b64decode(body).hex()
    return {
        "statusCode": 201,
        "headers": {"x-seen-path": event["rawPath"], "content-type": "application/json"},
        "cookies": ["a=1; Path=/"],
        "body": json.dumps({
            "method": event["requestContext"]["http"]["method"],
            "query": event.get("queryStringParameters"),
            "raw_query": event["rawQueryString"],
            "header": event["headers"].get("x-custom"),
            "cookies": event.get("cookies"),
            "body": body,
            "version": event["version"],
        }),
    }
"""


def http(url, method="GET", data=None, headers=None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def code(e):
    return e.value.response["Error"]["Code"]


def test_function_url_config_and_requests(node, client):
    create(client, "web", zip_bytes({"handler.py": WEB}))
    cfg = client.create_function_url_config(FunctionName="web", AuthType="NONE",
                                            Cors={"AllowOrigins": ["https://example.com"], "AllowMethods": ["GET", "POST"], "MaxAge": 60})
    url = cfg["FunctionUrl"]
    assert url.startswith(node.endpoint) and url.endswith("/url/web/"), url
    assert cfg["AuthType"] == "NONE" and cfg["Cors"]["MaxAge"] == 60
    with pytest.raises(ClientError) as e:
        client.create_function_url_config(FunctionName="web", AuthType="NONE")
    assert code(e) == "ResourceConflictException"
    with pytest.raises(ClientError) as e:
        client.create_function_url_config(FunctionName="web", AuthType="OPEN")
    assert code(e) == "InvalidParameterValueException"
    assert client.get_function_url_config(FunctionName="web")["FunctionUrl"] == url
    assert [c["FunctionUrl"] for c in client.list_function_url_configs(FunctionName="web")["FunctionUrlConfigs"]] == [url]

    # A request with query, header, cookie and a text body.
    status, headers, body = http(url + "orders/7?a=1&b=x+y&a=2", "POST", b'{"n": 1}',
                                 {"X-Custom": "yes", "Cookie": "s=1; t=2", "Origin": "https://example.com"})
    assert status == 201, body
    got = json.loads(body)
    assert got == {"method": "POST", "query": {"a": "1,2", "b": "x y"}, "raw_query": "a=1&b=x+y&a=2", "header": "yes",
                   "cookies": ["s=1", "t=2"], "body": '{"n": 1}', "version": "2.0"}, got
    assert headers["x-seen-path"] == "/orders/7"
    assert headers["set-cookie"].startswith("a=1")
    assert headers["access-control-allow-origin"] == "https://example.com"
    # The same with curl, as a user would call it.
    out = subprocess.run(["curl", "-s", "-i", "-X", "POST", "-H", "X-Custom: curl", "--data-binary", '{"via": "curl"}',
                          url + "from/curl?q=1"], capture_output=True, timeout=60, check=True).stdout.decode()
    head, _, body = out.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 201") and "x-seen-path: /from/curl" in head.lower(), head
    got = json.loads(body)
    assert (got["method"], got["header"], got["query"], got["body"]) == ("POST", "curl", {"q": "1"}, '{"via": "curl"}'), got
    # Binary bodies arrive base64-encoded; a plain JSON result is a 200 JSON answer.
    status, _, body = http(url + "bin", "PUT", bytes([0, 255, 1]))
    assert status == 201 and json.loads(body)["body"] == "00ff01"
    status, headers, body = http(url + "plain")
    assert (status, json.loads(body)) == (200, {"just": "json"})
    assert "access-control-allow-origin" not in {k.lower() for k in headers}, "no Origin, no CORS headers"
    # CORS preflight: answered without invoking.
    status, headers, _ = http(url + "x", "OPTIONS", headers={"Origin": "https://example.com", "Access-Control-Request-Method": "POST"})
    assert status == 200 and headers["access-control-allow-methods"] == "GET,POST" and headers["access-control-max-age"] == "60"

    # AWS_IAM: unsigned is refused, signed with the node's key goes through.
    cfg = client.update_function_url_config(FunctionName="web", AuthType="AWS_IAM")
    assert cfg["AuthType"] == "AWS_IAM" and cfg["Cors"]["MaxAge"] == 60, "unchanged fields are kept"
    status, _, _ = http(url + "plain")
    assert status == 403
    req = AWSRequest(method="GET", url=url + "plain", headers={"host": url.split("/")[2]})
    SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "lambda", "us-east-1").add_auth(req)
    status, _, body = http(url + "plain", headers=dict(req.headers))
    assert (status, json.loads(body)) == (200, {"just": "json"})

    client.delete_function_url_config(FunctionName="web")
    assert http(url + "plain")[0] == 404
    with pytest.raises(ClientError) as e:
        client.get_function_url_config(FunctionName="web")
    assert code(e) == "ResourceNotFoundException"
    assert http(node.endpoint + "/url/no-such-function/")[0] == 404
    client.delete_function(FunctionName="web")
