// The library a node loads: built from troupe's headers alone (the node's own symbols serve
// it), it declares the class and the constructor the node can then host.
#include "plugin_actor.hpp"

TROUPE_REMOTE_CTOR(plugin_greeter, std::string)
