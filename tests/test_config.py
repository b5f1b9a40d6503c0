"""Configuration (service/config.py): the environment configures the service; a test's mapping is all
a test app gets."""
from service import create_app
from service.config import Config
from service.state import app_state


def test_a_test_app_ignores_the_developers_environment(make_app, monkeypatch):
    monkeypatch.setenv("CONTEXT_MAX_BATCH", "3")
    monkeypatch.setenv("CONTEXT_EXTRA_TYPES", "design_note")
    config = make_app().config["CONTEXT"]
    assert config.max_batch == 1000 and config.types == Config().types
    assert make_app(max_batch="7").config["CONTEXT"].max_batch == 7     # strings coerced as from the environment


def test_the_service_reads_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CONTEXT_DATA_DIR", str(tmp_path / "env-data"))
    monkeypatch.setenv("CONTEXT_MAX_BATCH", "3")
    monkeypatch.setenv("CONTEXT_BACKGROUND", "0")
    app = create_app()               # as gunicorn calls it: service:create_app()
    try:
        config = app.config["CONTEXT"]
        assert config.max_batch == 3 and config.data_dir == str(tmp_path / "env-data")
        assert app.test_client().post("/mcp/push", json=[{}] * 4).get_json()["code"] == "batch_too_large"
    finally:
        app_state(app).shutdown()


def test_from_mapping_takes_prefixed_or_plain_names_and_ignores_others():
    config = Config.from_mapping({"CONTEXT_MAX_BATCH": "5", "stem": "false", "allowed_hosts": ["a.test"],
                                  "no_such_setting": 1})
    assert (config.max_batch, config.stem, config.allowed_hosts) == (5, False, ("a.test",))


def test_a_removed_setting_refuses_the_start_instead_of_being_ignored(monkeypatch):
    """CONTEXT_BM25_K1/_B once changed only the strong path and silently turned the read index off; they
    are gone, and setting one says so rather than ranking differently from what the user asked."""
    import pytest
    monkeypatch.setenv("CONTEXT_BM25_K1", "0.9")
    with pytest.raises(ValueError, match="CONTEXT_BM25_K1 is no longer a setting"):
        Config.from_env()
    monkeypatch.delenv("CONTEXT_BM25_K1")
    assert Config.from_env().max_batch == 1000
