"""A bare Litestar app with our SQLAlchemy plugin: proves `litestar database upgrade` works."""

from advanced_alchemy.extensions.litestar import SQLAlchemyPlugin
from litestar import Litestar

from app.settings import Settings
from tests.db.alchemy_config import make_alchemy_config

app = Litestar(plugins=[SQLAlchemyPlugin(config=make_alchemy_config(Settings.from_env()))])
