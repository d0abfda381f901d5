package csiplugin

import "github.com/nodevol/nodevol/registration"

// RegistrationConfig configures the handler NewRegistrationHandler
// returns; it is registration.Config.
type RegistrationConfig = registration.Config

// NewRegistrationHandler returns registration.New(cfg): the
// pluginmanager.Handler that registers the CSI drivers announced through
// plugin registration.
func NewRegistrationHandler(cfg RegistrationConfig) (*registration.Handler, error) {
	return registration.New(cfg)
}
