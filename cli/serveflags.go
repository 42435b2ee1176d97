package cli

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/deepinfer/deepinfer-go/server"
)

// apiKeyEnv names the environment variable serve reads the API key from
// when --api-key is not given.
const apiKeyEnv = "DEEPINFER_API_KEY"

// serveLimits binds serve's flags for access control (API key, CORS) and
// for what one client may hold (body size, timeouts, connections).
type serveLimits struct {
	apiKey                                  string
	origins                                 []string
	maxBody                                 int64
	headerTimeout, bodyTimeout, idleTimeout time.Duration
	maxConns                                int
}

// register adds the flags to cmd, with the server's defaults.
func (sl *serveLimits) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&sl.apiKey, "api-key", "", "require \"Authorization: Bearer KEY\" on every route but /health and /metrics; default: $"+apiKeyEnv+", else none")
	fl.StringSliceVar(&sl.origins, "allowed-origins", nil, "origins browsers may call the API from (CORS), comma-separated, or * for any; default: none (CORS off)")
	fl.Int64Var(&sl.maxBody, "max-body-bytes", server.DefaultMaxBodyBytes, "largest request body accepted (413 past it)")
	fl.DurationVar(&sl.headerTimeout, "read-header-timeout", server.DefaultReadHeaderTimeout, "time a client gets to send a request's headers; 0: no limit")
	fl.DurationVar(&sl.bodyTimeout, "body-read-timeout", server.DefaultBodyReadTimeout, "time a client gets to send a request's body (408 past it); 0: no limit")
	fl.DurationVar(&sl.idleTimeout, "idle-timeout", server.DefaultIdleTimeout, "keep-alive connections idle this long are closed; 0: no limit")
	fl.IntVar(&sl.maxConns, "max-conns", server.DefaultMaxConns, "connections served at once; more wait in the listen backlog until one closes; 0: no cap")
}

// apply checks the flags and sets them in o. keyGiven says whether
// --api-key was on the command line; when it was not, the key is
// getenv(DEEPINFER_API_KEY). A zero timeout or connection cap on the
// command line means none (server.Options reads 0 as its default).
func (sl *serveLimits) apply(o *server.Options, keyGiven bool, getenv func(string) string) error {
	o.APIKey = sl.apiKey
	if !keyGiven {
		o.APIKey = getenv(apiKeyEnv)
	}
	if o.APIKey != strings.TrimSpace(o.APIKey) {
		return fmt.Errorf("serve: the API key has leading or trailing white space, which no client can send")
	}
	o.AllowedOrigins = nil
	for _, origin := range sl.origins {
		origin = strings.TrimSpace(origin)
		if origin == "" {
			continue
		}
		if err := checkOrigin(origin); err != nil {
			return err
		}
		o.AllowedOrigins = append(o.AllowedOrigins, origin)
	}
	if sl.maxBody <= 0 {
		return fmt.Errorf("serve: --max-body-bytes must be positive, got %d", sl.maxBody)
	}
	o.MaxBodyBytes = sl.maxBody
	for _, d := range []struct {
		name string
		v    time.Duration
		dst  *time.Duration
	}{
		{"--read-header-timeout", sl.headerTimeout, &o.ReadHeaderTimeout},
		{"--body-read-timeout", sl.bodyTimeout, &o.BodyReadTimeout},
		{"--idle-timeout", sl.idleTimeout, &o.IdleTimeout},
	} {
		switch {
		case d.v < 0:
			return fmt.Errorf("serve: %s must be 0 (no limit) or positive, got %s", d.name, d.v)
		case d.v == 0:
			*d.dst = -1
		default:
			*d.dst = d.v
		}
	}
	switch {
	case sl.maxConns < 0:
		return fmt.Errorf("serve: --max-conns must be 0 (no cap) or positive, got %d", sl.maxConns)
	case sl.maxConns == 0:
		o.MaxConns = -1
	default:
		o.MaxConns = sl.maxConns
	}
	return nil
}

// checkOrigin accepts "*" and scheme://host[:port], as browsers send
// Origin (no path, no trailing slash needed).
func checkOrigin(origin string) error {
	if origin == "*" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Scheme == "" || u.Host == "" || strings.TrimSuffix(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("serve: --allowed-origins: %q is not an origin: want scheme://host[:port] (e.g. https://app.example.com) or *", origin)
	}
	return nil
}
