"""A bare Litestar app with our SQLAlchemy plugin: proves `litestar database upgrade` works."""

from advanced_alchemy.extensions.litestar import SQLAlchemyPlugin
from litestar import Litestar

from app.db.config import make_alchemy_config
from app.settings import Settings

app = Litestar(plugins=[SQLAlchemyPlugin(config=make_alchemy_config(Settings.from_env()))])
