"""Tests of config/: the rabbitmq.conf parser, file loading, and overrides."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from warren.config import ConfigError, Listener, Settings, load_settings, parse_config
from warren.config import parser as config_parser

EXAMPLE = Path(__file__).resolve().parent.parent / "rabbitmq.conf.example"
DEFAULTS = Settings()


def error_of(text: str, filename: str = "rabbitmq.conf") -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, filename)
    return caught.value


# --------------------------------------------------------------------------
# defaults and the example file


def test_empty_text_gives_rabbitmq_defaults() -> None:
    settings = parse_config("")
    assert settings == DEFAULTS
    assert settings.listeners == (Listener("default", "", 5672),)  # every address
    assert settings.ignored_keys == ()


def test_no_file_and_no_environment_gives_defaults() -> None:
    settings = load_settings(environ={})
    assert settings == DEFAULTS
    assert settings.config_files == ()


def test_example_loads_and_matches_the_defaults() -> None:
    settings = load_settings(EXAMPLE, environ={})
    assert settings == DEFAULTS
    assert settings.ignored_keys == ()
    assert settings.config_files == (str(EXAMPLE),)


def test_example_mentions_every_key_warren_reads() -> None:
    text = EXAMPLE.read_text()
    documented = set(re.findall(r"^#?\s*([a-z_.]+[a-z_])\s*=", text, re.MULTILINE))
    for key in config_parser._KEYS:
        assert key in documented, key
    for family in config_parser._FAMILIES:
        assert any(k.startswith(family + ".") for k in documented), family


def test_settings_are_frozen_and_hide_the_password() -> None:
    settings = parse_config("default_pass = hunter2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.heartbeat = 5  # type: ignore[misc]
    assert "hunter2" not in repr(settings)


# --------------------------------------------------------------------------
# line syntax


def test_comments_blank_lines_and_whitespace() -> None:
    text = (
        "# a full-line comment\n"
        "\n"
        "   \t\n"
        "   # an indented comment\n"
        "heartbeat = 30   # a trailing comment\n"
        "\tchannel_max=100\t\n"
        "default_vhost   =    staging  \n"
    )
    settings = parse_config(text)
    assert settings.heartbeat == 30
    assert settings.channel_max == 100
    assert settings.default_vhost == "staging"


def test_hash_without_whitespace_before_it_is_part_of_the_value() -> None:
    assert parse_config("default_pass = pa#ss").default_pass == "pa#ss"
    assert parse_config("default_pass = pa#ss # note").default_pass == "pa#ss"


def test_single_quotes_keep_hashes_and_spaces() -> None:
    settings = parse_config("default_pass = ' p4ss #1 '  # the password\ndefault_user = 'bob'")
    assert settings.default_pass == " p4ss #1 "
    assert settings.default_user == "bob"


def test_value_may_contain_equals_signs_and_spaces() -> None:
    settings = parse_config("default_pass = a=b c\nload_definitions = /etc/my defs.json")
    assert settings.default_pass == "a=b c"
    assert settings.load_definitions == "/etc/my defs.json"


def test_crlf_line_endings_and_byte_order_mark() -> None:
    settings = parse_config("\ufeffheartbeat = 5\r\nframe_max = 8192\r\n")
    assert (settings.heartbeat, settings.frame_max) == (5, 8192)


def test_later_line_wins_within_a_file() -> None:
    assert parse_config("heartbeat = 5\nheartbeat = 7").heartbeat == 7


def test_escaped_dot_in_a_name() -> None:
    settings = parse_config("loopback_users.ops\\.admin = true")
    assert settings.loopback_users == ("ops.admin",)


# --------------------------------------------------------------------------
# every key


@pytest.mark.parametrize(
    ("line", "field", "expected"),
    [
        ("default_user = admin", "default_user", "admin"),
        ("default_pass = s3cret", "default_pass", "s3cret"),
        ("default_vhost = prod", "default_vhost", "prod"),
        ("heartbeat = 0", "heartbeat", 0),
        ("heartbeat = 580", "heartbeat", 580),
        ("heartbeat = 65535", "heartbeat", 65535),
        ("frame_max = 0", "frame_max", 0),
        ("frame_max = 8192", "frame_max", 8192),
        ("frame_max = 2147483647", "frame_max", 2**31 - 1),
        ("frame_max = 128KB", "frame_max", 131072),
        ("frame_max = 1mb", "frame_max", 1048576),
        ("frame_max = 1GB", "frame_max", 1073741824),
        ("channel_max = 0", "channel_max", 0),
        ("channel_max = 65535", "channel_max", 65535),
        ("handshake_timeout = 1", "handshake_timeout", 1),
        ("handshake_timeout = 30000", "handshake_timeout", 30000),
        ("consumer_timeout = 1", "consumer_timeout", 1),
        ("consumer_timeout = 3600000", "consumer_timeout", 3600000),
        ("consumer_timeout = infinity", "consumer_timeout", None),
        ("consumer_timeout = none", "consumer_timeout", None),
        ("consumer_max_per_channel = 10", "consumer_max_per_channel", 10),
        (
            "exchange_types.local_random.enabled = false",
            "local_random_exchange_enabled",
            False,
        ),
        ("consumer_max_per_channel = infinity", "consumer_max_per_channel", None),
        ("max_message_size = 1", "max_message_size", 1),
        ("max_message_size = 536870912", "max_message_size", 536870912),
        ("log.console = false", "log_console", False),
        ("log.console = true", "log_console", True),
        ("log.console.level = debug", "log_level", "debug"),
        ("log.console.level = warning", "log_level", "warning"),
        ("log.console.level = error", "log_level", "error"),
        ("log.console.level = critical", "log_level", "critical"),
        ("log.console.level = none", "log_level", "none"),
        ("log.console.level = notice", "log_level", "info"),
        ("log.console.level = emergency", "log_level", "critical"),
        ("log.console.formatter = json", "log_formatter", "json"),
        ("log.console.formatter = plaintext", "log_formatter", "plaintext"),
        ("management.tcp.port = 15673", "management_port", 15673),
        ("management.tcp.port = none", "management_port", None),
        ("management.tcp.ip = 127.0.0.1", "management_ip", "127.0.0.1"),
        ("management.tcp.ip = ::", "management_ip", "::"),
        ("management.tcp.ip = localhost", "management_ip", "localhost"),
        ("prometheus.tcp.port = 9419", "prometheus_port", 9419),
        ("prometheus.tcp.port = none", "prometheus_port", None),
        ("disk_free_limit.absolute = 1", "disk_free_limit_absolute", 1),
        ("load_definitions = /etc/rabbitmq/definitions.json", "load_definitions", None),
        ("data_dir = /var/lib/warren", "data_dir", "/var/lib/warren"),
    ],
)
def test_key_sets_its_field(line: str, field: str, expected: object) -> None:
    if field == "load_definitions":
        expected = line.split("=", 1)[1].strip()
    settings = parse_config(line)
    assert getattr(settings, field) == expected
    # and nothing else changed
    assert dataclasses.replace(settings, **{field: getattr(DEFAULTS, field)}) == DEFAULTS


def test_default_permissions_order_is_configure_write_read() -> None:
    settings = parse_config(
        "default_permissions.configure = ^conf-.*\n"
        "default_permissions.read = ^read-.*\n"
        "default_permissions.write = ^write-.*\n"
    )
    assert settings.default_permissions == ("^conf-.*", "^write-.*", "^read-.*")


def test_one_default_permission_keeps_the_others() -> None:
    settings = parse_config("default_permissions.write = ''")
    assert settings.default_permissions == (".*", "", ".*")


def test_default_user_tags() -> None:
    assert parse_config("default_user_tags.administrator = true").default_user_tags == (
        "administrator",
    )
    # naming any tag replaces the default list, as in RabbitMQ
    assert parse_config("default_user_tags.monitoring = true").default_user_tags == ("monitoring",)
    assert parse_config("default_user_tags.administrator = false").default_user_tags == ()
    settings = parse_config(
        "default_user_tags.administrator = true\n"
        "default_user_tags.management = true\n"
        "default_user_tags.policymaker = false\n"
    )
    assert settings.default_user_tags == ("administrator", "management")


def test_loopback_users() -> None:
    assert parse_config("loopback_users = none").loopback_users == ()
    assert parse_config("loopback_users.guest = false").loopback_users == ()
    assert parse_config("loopback_users.guest = true").loopback_users == ("guest",)
    assert parse_config("loopback_users.admin = true").loopback_users == ("admin",)
    # none wins over named users, as in RabbitMQ
    assert parse_config("loopback_users.admin = true\nloopback_users = none").loopback_users == ()


# --------------------------------------------------------------------------
# listeners


@pytest.mark.parametrize(
    ("value", "host", "port"),
    [
        ("5672", "", 5672),  # IPv6 and IPv4, as RabbitMQ (broker/server/listen.py)
        ("0", "", 0),
        ("127.0.0.1:5673", "127.0.0.1", 5673),
        ("0.0.0.0:5672", "0.0.0.0", 5672),
        ("[::1]:5672", "::1", 5672),
        ("[::]:5672", "::", 5672),
        ("::1:5672", "::1", 5672),
        (":::5672", "::", 5672),
        ("[fe80::1]:65535", "fe80::1", 65535),
        ("localhost:5672", "localhost", 5672),
    ],
)
def test_listener_address_forms(value: str, host: str, port: int) -> None:
    settings = parse_config(f"listeners.tcp.default = {value}")
    assert settings.listeners == (Listener("default", host, port),)


def test_named_listeners_replace_the_default() -> None:
    settings = parse_config(
        "listeners.tcp.local = 127.0.0.1:5672\nlisteners.tcp.local_v6 = [::1]:5672\n"
    )
    assert settings.listeners == (
        Listener("local", "127.0.0.1", 5672),
        Listener("local_v6", "::1", 5672),
    )


def test_default_and_extra_listeners() -> None:
    settings = parse_config("listeners.tcp.default = 5672\nlisteners.tcp.other = 5673")
    assert settings.listeners == (
        Listener("default", "", 5672),
        Listener("other", "", 5673),
    )


def test_listeners_tcp_none_disables_tcp() -> None:
    assert parse_config("listeners.tcp = none").listeners == ()
    assert parse_config("listeners.tcp.default = 5672\nlisteners.tcp = none").listeners == ()


def test_two_listeners_on_one_address_is_an_error() -> None:
    error = error_of("listeners.tcp.a = 5672\n# x\nlisteners.tcp.b = 0.0.0.0:5672")
    assert (error.filename, error.lineno, error.key) == ("rabbitmq.conf", 3, "listeners.tcp.b")
    assert "listeners.tcp.a (rabbitmq.conf:1)" in str(error)


def test_port_zero_listeners_may_repeat() -> None:
    assert len(parse_config("listeners.tcp.a = 0\nlisteners.tcp.b = 0").listeners) == 2


# --------------------------------------------------------------------------
# sizes with units


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("50000000", 50_000_000),
        ("0", 0),
        ("500kB", 500_000),
        ("500KB", 500_000),
        ("500MB", 500_000_000),
        ("2GB", 2_000_000_000),
        ("2gb", 2_000_000_000),
        ("1TB", 10**12),
        ("1PB", 10**15),
        ("1k", 1024),
        ("1K", 1024),
        ("1KiB", 1024),
        ("1kib", 1024),
        ("1Ki", 1024),
        ("1024M", 1024**3),
        ("1MiB", 1024**2),
        ("1G", 1024**3),
        ("1GiB", 1024**3),
        ("2TiB", 2 * 1024**4),
        ("1PiB", 1024**5),
    ],
)
def test_information_units(value: str, size: int) -> None:
    assert parse_config(f"disk_free_limit.absolute = {value}").disk_free_limit_absolute == size
    settings = parse_config(f"vm_memory_high_watermark.absolute = {value}")
    assert settings.vm_memory_high_watermark_absolute == size
    assert settings.vm_memory_high_watermark_relative is None


@pytest.mark.parametrize("value", ["0", "0.4", "0.6", "1", "1.5", ".5", "1."])
def test_relative_memory_watermark(value: str) -> None:
    settings = parse_config(f"vm_memory_high_watermark.relative = {value}")
    assert settings.vm_memory_high_watermark_relative == float(value)
    assert settings.vm_memory_high_watermark_absolute is None


def test_absolute_memory_watermark_wins_over_relative() -> None:
    for text in (
        "vm_memory_high_watermark.absolute = 1GiB\nvm_memory_high_watermark.relative = 0.4",
        "vm_memory_high_watermark.relative = 0.4\nvm_memory_high_watermark.absolute = 1GiB",
    ):
        settings = parse_config(text)
        assert settings.vm_memory_high_watermark_absolute == 1024**3
        assert settings.vm_memory_high_watermark_relative is None


# --------------------------------------------------------------------------
# bad values: file, line, key, value and what is accepted


BAD_VALUES = [
    ("consumer_timeout", "0", "a positive integer (milliseconds), or 'infinity'"),
    ("consumer_timeout", "-5", "a positive integer (milliseconds), or 'infinity'"),
    ("consumer_timeout", "false", "a positive integer (milliseconds), or 'infinity'"),
    ("consumer_timeout", "abc", "a positive integer (milliseconds), or 'infinity'"),
    ("consumer_timeout", "1.5", "a positive integer (milliseconds), or 'infinity'"),
    ("consumer_timeout", "Infinity", "a positive integer (milliseconds), or 'infinity'"),
    ("consumer_max_per_channel", "0", "a positive integer, or 'infinity'"),
    ("heartbeat", "-1", "an integer from 0 to 65535"),
    ("heartbeat", "65536", "an integer from 0 to 65535"),
    ("heartbeat", "ten", "an integer from 0 to 65535"),
    ("frame_max", "8191", "0 (no limit) or a frame size from 8192 to 2147483647"),
    ("warren.frame_min_size", "1024", "8192 (RabbitMQ 4.1+) or 4096 (3.x)"),
    ("warren.read_coalescing_interval", "101", "an integer from 0 to 100 (milliseconds)"),
    ("warren.read_coalescing_interval", "-1", "an integer from 0 to 100 (milliseconds)"),
    ("warren.read_coalescing_interval", "0.5", "an integer from 0 to 100 (milliseconds)"),
    ("frame_max", "2147483648", "0 (no limit) or a frame size from 8192 to 2147483647"),
    ("frame_max", "-1", "0 (no limit) or a frame size from 8192 to 2147483647"),
    ("frame_max", "1KiB", "0 (no limit) or a frame size from 8192 to 2147483647"),
    ("channel_max", "65536", "an integer from 0 to 65535"),
    ("channel_max", "-1", "an integer from 0 to 65535"),
    ("handshake_timeout", "0", "a positive integer (milliseconds)"),
    ("handshake_timeout", "infinity", "a positive integer (milliseconds)"),
    ("max_message_size", "0", "an integer from 1 to 536870912 (bytes)"),
    ("max_message_size", "536870913", "an integer from 1 to 536870912 (bytes)"),
    ("max_message_size", "16MB", "an integer from 1 to 536870912 (bytes)"),
    ("log.console", "yes", "'true' or 'false'"),
    ("log.console", "True", "'true' or 'false'"),
    ("log.console.level", "verbose", "one of: debug, info, warning, error, critical, none"),
    ("log.console.formatter", "xml", "one of: plaintext, json"),
    ("management.tcp.port", "0", "a port number from 1 to 65535, or 'none'"),
    ("management.tcp.port", "65536", "a port number from 1 to 65535, or 'none'"),
    ("prometheus.tcp.port", "http", "a port number from 1 to 65535, or 'none'"),
    ("management.tcp.ip", "999.1.1.1", "an IP address or a host name"),
    ("management.tcp.ip", "bad host!", "an IP address or a host name"),
    ("vm_memory_high_watermark.relative", "-0.1", "a number >= 0"),
    ("vm_memory_high_watermark.relative", "high", "a number >= 0"),
    ("vm_memory_high_watermark.relative", "inf", "a number >= 0"),
    ("vm_memory_high_watermark.absolute", "2XB", "a size in bytes"),
    ("vm_memory_high_watermark.absolute", "-2GB", "a size in bytes"),
    ("disk_free_limit.absolute", "1.5GB", "a size in bytes"),
    ("disk_free_limit.absolute", "2 GB", "a size in bytes"),
    ("disk_free_limit.absolute", "lots", "a size in bytes"),
    ("listeners.tcp.default", "65536", "with a port from 0 to 65535"),
    ("listeners.tcp.default", "-1", "'address:port'"),
    ("listeners.tcp.default", "127.0.0.1", "'address:port'"),
    ("listeners.tcp.default", "127.0.0.1:", "'address:port'"),
    ("listeners.tcp.default", ":5672", "'address:port'"),
    ("listeners.tcp.default", "[127.0.0.1]:5672", "'[IPv6 address]:port'"),
    ("listeners.tcp.default", "[::1]", "'[IPv6 address]:port'"),
    ("listeners.tcp", "all", "'none'"),
    ("loopback_users", "guest", "'none'"),
    ("loopback_users.guest", "yes", "'true' or 'false'"),
    ("default_user_tags.administrator", "1", "'true' or 'false'"),
    ("default_permissions.configure", "(", "a regular expression"),
    ("default_user", "''", "a non-empty string"),
    ("default_vhost", "''", "a non-empty string"),
    ("data_dir", "''", "a path"),
    ("load_definitions", "''", "a path"),
]


@pytest.mark.parametrize(("key", "value", "accepted"), BAD_VALUES)
def test_bad_value_is_reported_with_file_line_key_and_what_is_accepted(
    key: str, value: str, accepted: str
) -> None:
    error = error_of(f"# header\n\nheartbeat = 30\n{key} = {value}\n")
    shown = value.strip("'")
    assert str(error).startswith(f"rabbitmq.conf:4: {key} = {shown}".rstrip() + ": expected ")
    assert accepted in str(error)
    assert (error.filename, error.lineno, error.key) == ("rabbitmq.conf", 4, key)


def test_example_error_message_from_the_issue() -> None:
    text = "\n" * 11 + "consumer_timeout = 0\n"
    assert str(error_of(text)) == (
        "rabbitmq.conf:12: consumer_timeout = 0: "
        "expected a positive integer (milliseconds), or 'infinity'"
    )


def test_config_error_is_a_value_error() -> None:
    error = error_of("heartbeat = x")
    assert isinstance(error, ValueError)
    assert error.value == "x"
    assert error.message.startswith("expected an integer")


def test_bad_value_is_an_error_even_when_a_later_line_overrides_it() -> None:
    assert error_of("heartbeat = x\nheartbeat = 5").lineno == 1


def test_error_messages_mask_passwords() -> None:
    error = error_of("default_pasword = hunter2")
    assert "hunter2" not in str(error)
    assert "default_pasword = ********" in str(error)


# --------------------------------------------------------------------------
# malformed lines


def test_line_without_equals_sign() -> None:
    error = error_of("heartbeat = 5\nheartbeat 10")
    assert (error.lineno, error.key) == (2, "heartbeat")
    assert str(error) == "rabbitmq.conf:2: heartbeat: expected 'key = value', got 'heartbeat 10'"


def test_garbage_line() -> None:
    error = error_of("!!!")
    assert (error.filename, error.lineno, error.key) == ("rabbitmq.conf", 1, None)
    assert "expected 'key = value'" in str(error)


def test_empty_key() -> None:
    error = error_of("\n  = 5")
    assert (error.lineno, error.key) == (2, None)
    assert str(error).startswith("rabbitmq.conf:2: expected 'key = value', got no key")


@pytest.mark.parametrize(
    "key", ["a..b", ".heartbeat", "heartbeat.", "default user", "loopback_users.bob@example"]
)
def test_malformed_key(key: str) -> None:
    error = error_of(f"{key} = 1")
    assert error.key == key
    assert str(error) == (
        f"rabbitmq.conf:1: {key}: malformed key: "
        "expected words of letters, digits, '_' and '-' joined by dots"
    )


def test_huge_numbers_are_rejected_not_crashed_on() -> None:
    digits = "9" * 5000
    for key in ("heartbeat", "frame_max", "disk_free_limit.absolute", "listeners.tcp.default"):
        assert "expected" in str(error_of(f"{key} = {digits}"))


@pytest.mark.parametrize("line", ["heartbeat =", "heartbeat =   ", "heartbeat = # none"])
def test_missing_value(line: str) -> None:
    error = error_of(line)
    assert str(error) == "rabbitmq.conf:1: heartbeat =: missing value after '='"
    assert error.key == "heartbeat"


def test_include_directive_is_refused() -> None:
    error = error_of("include conf.d/*.conf")
    assert "'include' is not supported" in str(error)
    assert error.lineno == 1


def test_default_filename_is_string_marker() -> None:
    with pytest.raises(ConfigError, match=r"^<string>:1: "):
        parse_config("heartbeat = x")


# --------------------------------------------------------------------------
# unknown and ignored keys


def test_unknown_key_is_an_error_with_a_suggestion() -> None:
    error = error_of("heartbaet = 10")
    assert (error.lineno, error.key) == (1, "heartbaet")
    assert str(error).startswith("rabbitmq.conf:1: heartbaet = 10: unknown key")
    assert "did you mean 'heartbeat'?" in str(error)


@pytest.mark.parametrize(
    "key",
    [
        "no_such_key",
        "log.console.levle",
        "listeners.tcp.a.b",
        "default_permissions.delete",
        "vm_memory_high_watermark.percent",
        "disk_free_limit.absolutely",
        "loopback_users.guest.x",
    ],
)
def test_keys_near_known_ones_are_errors(key: str) -> None:
    assert "unknown key" in str(error_of(f"{key} = true"))


IGNORED = [
    "cluster_formation.peer_discovery_backend = classic_config",
    "cluster_formation.classic_config.nodes.1 = rabbit@host1",
    "cluster_name = prod",
    "cluster_partition_handling = autoheal",
    "cluster_keepalive_interval = 10000",
    # TLS keys beyond those Warren reads (tests/test_tls.py)
    "ssl_options.versions.1 = tlsv1.2",
    "ssl_options.depth = 2",
    "ssl_options.honor_cipher_order = true",
    "ssl_handshake_timeout = 5000",
    "management.tcp.compress = true",
    "management.ssl.port = 15671",
    "management.load_definitions = /x.json",
    "prometheus.return_per_object_metrics = true",
    "prometheus.path = /metrics",
    "log.file = false",
    "log.file.level = debug",
    "log.dir = /var/log/rabbitmq",
    "log.connection.level = warning",
    "log.default.level = info",
    "log.console.formatter.time_format = epoch_secs",
    "log.console.stdio = stderr",
    "auth_backends.1 = internal",
    "auth_mechanisms.1 = PLAIN",
    "collect_statistics = coarse",
    "queue_master_locator = min-masters",
    "mqtt.listeners.tcp.default = 1883",
    "stomp.default_user = guest",
    "web_stomp.tcp.port = 15674",
    "web_mqtt.tcp.port = 15675",
    "total_memory_available_override_value = 8GB",
    "vm_memory_calculation_strategy = rss",
    "tcp_listen_options.backlog = 128",
    "num_acceptors.tcp = 10",
    "reverse_dns_lookups = true",
    "proxy_protocol = false",
    "default_consumer_prefetch.false = 0",
    "channel_operation_timeout = 15000",
    "mirroring_sync_batch_size = 4096",
    "queue_index_embed_msgs_below = 4096",
    "disk_free_limit.relative = 2.0",
    "vm_memory_high_watermark_paging_ratio = 0.5",
    "memory_monitor_interval = 2500",
    "credit_flow_default_credit.1 = 400",
    "deprecated_features.x = 1",  # RabbitMQ reads only deprecated_features.permit.*
    "distribution.listener.port_range.min = 25672",
    "classic_queue.default_version = 2",
    "quorum_queue.compute_checksums = false",
    "raft.wal_max_size_bytes = 64000000",
    "ranch_connection_max = 1000",
    "definitions.local.path = /defs.json",
]


@pytest.mark.parametrize("line", IGNORED)
def test_rabbitmq_keys_warren_does_not_use_are_recorded(line: str) -> None:
    settings = parse_config(line)
    assert settings.ignored_keys == (line.split("=")[0].strip(),)
    assert dataclasses.replace(settings, ignored_keys=()) == DEFAULTS


def test_ignored_keys_keep_order_and_are_listed_once() -> None:
    settings = parse_config(
        "cluster_name = a\nheartbeat = 5\nlog.file.level = debug\ncluster_name = b\n"
    )
    assert settings.ignored_keys == ("cluster_name", "log.file.level")
    assert settings.heartbeat == 5


def test_ignored_keys_do_not_change_equality() -> None:
    assert parse_config("cluster_name = x") == DEFAULTS


# --------------------------------------------------------------------------
# loading files: path, RABBITMQ_CONFIG_FILE, conf.d


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_load_from_path(tmp_path: Path) -> None:
    conf = write(tmp_path / "rabbitmq.conf", "heartbeat = 20\n")
    settings = load_settings(str(conf), environ={})
    assert settings.heartbeat == 20
    assert settings.config_files == (str(conf),)


def test_load_from_environment_variable(tmp_path: Path) -> None:
    conf = write(tmp_path / "rabbitmq.conf", "heartbeat = 21\n")
    assert load_settings(environ={"RABBITMQ_CONFIG_FILE": str(conf)}).heartbeat == 21


def test_path_argument_wins_over_environment_variable(tmp_path: Path) -> None:
    one = write(tmp_path / "one" / "rabbitmq.conf", "heartbeat = 1\n")
    two = write(tmp_path / "two" / "rabbitmq.conf", "heartbeat = 2\n")
    assert load_settings(str(one), environ={"RABBITMQ_CONFIG_FILE": str(two)}).heartbeat == 1


def test_empty_environment_variable_means_no_file() -> None:
    assert load_settings(environ={"RABBITMQ_CONFIG_FILE": ""}) == DEFAULTS


def test_environ_defaults_to_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = write(tmp_path / "rabbitmq.conf", "heartbeat = 22\n")
    monkeypatch.setenv("RABBITMQ_CONFIG_FILE", str(conf))
    monkeypatch.setenv("RABBITMQ_DEFAULT_USER", "from-env")
    settings = load_settings()
    assert (settings.heartbeat, settings.default_user) == (22, "from-env")


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.conf"
    with pytest.raises(ConfigError) as caught:
        load_settings(str(missing), environ={})
    assert caught.value.filename == str(missing)
    assert caught.value.lineno is None
    assert str(caught.value).startswith(f"{missing}: cannot read the config file")


def test_directory_instead_of_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_settings(str(tmp_path), environ={})


def test_path_without_extension_finds_the_conf_file(tmp_path: Path) -> None:
    write(tmp_path / "rabbitmq.conf", "heartbeat = 23\n")
    assert load_settings(str(tmp_path / "rabbitmq"), environ={}).heartbeat == 23


def test_erlang_term_config_is_refused(tmp_path: Path) -> None:
    conf = write(tmp_path / "rabbitmq.config", "[{rabbit, []}].\n")
    with pytest.raises(ConfigError, match=r"\.config\) files are not supported"):
        load_settings(str(conf), environ={})


def test_non_utf8_file_reports_the_line(tmp_path: Path) -> None:
    conf = tmp_path / "rabbitmq.conf"
    conf.write_bytes(b"heartbeat = 5\ndefault_pass = \xff\xfe\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(str(conf), environ={})
    assert (caught.value.filename, caught.value.lineno) == (str(conf), 2)
    assert "UTF-8" in str(caught.value)


def test_conf_d_files_are_merged_in_name_order(tmp_path: Path) -> None:
    main = write(
        tmp_path / "rabbitmq.conf",
        "heartbeat = 10\nchannel_max = 10\nframe_max = 10000\nlisteners.tcp.default = 5672\n",
    )
    # written out of order, so that creation order differs from name order
    b = write(tmp_path / "conf.d" / "20-b.conf", "channel_max = 20\nframe_max = 20000\n")
    a = write(
        tmp_path / "conf.d" / "10-a.conf",
        "heartbeat = 11\nchannel_max = 11\nlisteners.tcp.extra = 5673\n",
    )
    c = write(tmp_path / "conf.d" / "30-c.conf", "frame_max = 30000\n")
    write(tmp_path / "conf.d" / "notes.txt", "this is not a conf file\n")
    write(tmp_path / "conf.d" / ".editor-swap.conf", "garbage\n")
    (tmp_path / "conf.d" / "40-dir.conf").mkdir()

    settings = load_settings(str(main), environ={})
    assert settings.heartbeat == 11  # main, then 10-a
    assert settings.channel_max == 20  # 10-a, then 20-b
    assert settings.frame_max == 30000  # main, 20-b, then 30-c
    assert settings.listeners == (
        Listener("default", "", 5672),
        Listener("extra", "", 5673),
    )
    assert settings.config_files == (str(main), str(a), str(b), str(c))


def test_conf_d_can_clear_what_the_main_file_set(tmp_path: Path) -> None:
    main = write(tmp_path / "rabbitmq.conf", "loopback_users.guest = true\n")
    write(tmp_path / "conf.d" / "50-open.conf", "loopback_users.guest = false\n")
    assert load_settings(str(main), environ={}).loopback_users == ()


def test_error_in_conf_d_names_that_file(tmp_path: Path) -> None:
    main = write(tmp_path / "rabbitmq.conf", "heartbeat = 10\n")
    bad = write(tmp_path / "conf.d" / "10-bad.conf", "# tuning\nconsumer_timeout = false\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(str(main), environ={})
    assert (caught.value.filename, caught.value.lineno) == (str(bad), 2)
    assert str(caught.value).startswith(f"{bad}:2: consumer_timeout = false: expected ")


def test_duplicate_listener_across_files_names_both(tmp_path: Path) -> None:
    main = write(tmp_path / "rabbitmq.conf", "listeners.tcp.default = 5672\n")
    extra = write(tmp_path / "conf.d" / "a.conf", "listeners.tcp.again = 0.0.0.0:5672\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(str(main), environ={})
    assert caught.value.filename == str(extra)
    assert f"({main}:1)" in str(caught.value)


def test_ignored_keys_from_all_files(tmp_path: Path) -> None:
    main = write(tmp_path / "rabbitmq.conf", "cluster_name = x\n")
    write(tmp_path / "conf.d" / "a.conf", "mqtt.vhost = /\n")
    settings = load_settings(str(main), environ={})
    assert settings.ignored_keys == ("cluster_name", "mqtt.vhost")


# --------------------------------------------------------------------------
# environment and overrides


def test_environment_wins_over_the_file(tmp_path: Path) -> None:
    conf = write(
        tmp_path / "rabbitmq.conf", "default_user = file\ndefault_pass = file\ndefault_vhost = f\n"
    )
    env = {
        "RABBITMQ_DEFAULT_USER": "env-user",
        "RABBITMQ_DEFAULT_PASS": "env-pass",
        "RABBITMQ_DEFAULT_VHOST": "env-vhost",
    }
    settings = load_settings(str(conf), environ=env)
    assert (settings.default_user, settings.default_pass, settings.default_vhost) == (
        "env-user",
        "env-pass",
        "env-vhost",
    )


def test_environment_applies_without_a_file() -> None:
    settings = load_settings(environ={"RABBITMQ_DEFAULT_USER": "admin"})
    assert settings.default_user == "admin"
    assert settings.default_pass == "guest"


def test_empty_environment_values_are_ignored(tmp_path: Path) -> None:
    conf = write(tmp_path / "rabbitmq.conf", "default_user = file\n")
    settings = load_settings(str(conf), environ={"RABBITMQ_DEFAULT_USER": ""})
    assert settings.default_user == "file"


def test_overrides_are_applied_last(tmp_path: Path) -> None:
    conf = write(tmp_path / "rabbitmq.conf", "heartbeat = 10\ndefault_user = file\n")
    listeners = (Listener("cli", "127.0.0.1", 0),)
    settings = load_settings(
        str(conf),
        environ={"RABBITMQ_DEFAULT_USER": "env"},
        overrides={
            "heartbeat": 0,
            "default_user": "cli",
            "listeners": listeners,
            "consumer_timeout": None,
            "vm_memory_high_watermark_relative": 1,
        },
    )
    assert settings.heartbeat == 0
    assert settings.default_user == "cli"
    assert settings.listeners == listeners
    assert settings.consumer_timeout is None
    assert settings.vm_memory_high_watermark_relative == 1


def test_unknown_override_is_an_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={}, overrides={"port": 5673})
    assert (caught.value.filename, caught.value.key) == ("<overrides>", "port")
    assert (
        str(caught.value)
        == "<overrides>: port: unknown setting; expected a field of config.Settings"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("heartbeat", "60"),
        ("heartbeat", True),
        ("heartbeat", None),
        ("consumer_timeout", 1.5),
        ("default_user", 5),
        ("listeners", [Listener("a", "0.0.0.0", 1)]),
        ("listeners", (("a", "0.0.0.0", 1),)),
        ("default_permissions", (".*", ".*")),
    ],
)
def test_override_of_the_wrong_type_is_an_error(name: str, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={}, overrides={name: value})
    assert str(caught.value).startswith(f"<overrides>: {name} = {value!r}: expected ")


# --------------------------------------------------------------------------
# every mistake at once


THREE_MISTAKES = """\
listeners.tcp.default = 5672
heartbeat = often
vm_memory_high_watermark.relative = 0.4
chanel_max = 100
this line has no equals sign
"""


def test_three_mistakes_are_reported_together() -> None:
    error = error_of(THREE_MISTAKES)
    assert [(e.lineno, e.key) for e in error.errors] == [
        (2, "heartbeat"),
        (4, "chanel_max"),
        (5, "this"),
    ]
    lines = str(error).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("rabbitmq.conf:2: heartbeat = often: expected")
    assert lines[1].startswith("rabbitmq.conf:4: chanel_max = 100: unknown key")
    assert "did you mean 'channel_max'?" in lines[1]
    assert lines[2].startswith("rabbitmq.conf:5: this: expected 'key = value'")


def test_server_lists_all_three_mistakes_and_exits_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "rabbitmq.conf"
    bad.write_text(THREE_MISTAKES)
    out = subprocess.run(
        [sys.executable, "-m", "warren", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert lines[0] == "warren-server: 3 configuration errors:"
    assert [line.split(": ")[0].strip() for line in lines[1:]] == [
        f"{bad}:2",
        f"{bad}:4",
        f"{bad}:5",
    ]


def test_one_mistake_stays_one_error() -> None:
    error = error_of("heartbeat = often\n")
    assert error.errors == (error,)
    assert "\n" not in str(error)


def test_statistics_interval_and_stuck_consumer_threshold() -> None:
    settings = parse_config(
        "collect_statistics_interval = 10000\nwarren.consumer_stuck_after = 120000\n"
    )
    assert (settings.collect_statistics_interval, settings.consumer_stuck_after) == (
        10000,
        120000,
    )
    with pytest.raises(ConfigError, match="at least 100"):
        parse_config("collect_statistics_interval = 5\n")
