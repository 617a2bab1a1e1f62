package deploy

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// Workers stay off the route network (issue 29, item 2; docs/security.md,
// "No usable shared secret ships"): in compose only the nats-server nodes
// join the network their routes use, each binding its cluster listener to
// its address there; in Kubernetes a NetworkPolicy lets Brood's pods reach
// NATS's client port and not a route port.

// composeNetworks returns the networks a compose service joins (its
// networks as a list or a map) and, per network, its ipv4_address and
// aliases.
type composeAttachment struct {
	IPv4    string   `yaml:"ipv4_address"`
	Aliases []string `yaml:"aliases"`
}

type composeService struct {
	Command     []string  `yaml:"command"`
	Networks    yaml.Node `yaml:"networks"`
	NetworkMode string    `yaml:"network_mode"`
}

func (s composeService) attachments(t *testing.T) map[string]composeAttachment {
	t.Helper()
	out := map[string]composeAttachment{}
	switch s.Networks.Kind {
	case 0:
	case yaml.SequenceNode:
		var names []string
		if err := s.Networks.Decode(&names); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			out[n] = composeAttachment{}
		}
	case yaml.MappingNode:
		if err := s.Networks.Decode(&out); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("networks %v is neither a list nor a map", s.Networks.Kind)
	}
	return out
}

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Networks map[string]struct {
		Internal bool `yaml:"internal"`
		IPAM     struct {
			Config []struct {
				Subnet string `yaml:"subnet"`
			} `yaml:"config"`
		} `yaml:"ipam"`
	} `yaml:"networks"`
}

func TestWorkersStayOffTheRouteNetwork(t *testing.T) {
	t.Run("compose", func(t *testing.T) {
		data, err := os.ReadFile("compose/docker-compose.yml")
		if err != nil {
			t.Fatal(err)
		}
		var c composeFile
		if err := yaml.Unmarshal(data, &c); err != nil {
			t.Fatal(err)
		}
		routes, ok := c.Networks["routes"]
		if !ok || !routes.Internal || len(routes.IPAM.Config) != 1 {
			t.Fatalf("no internal network \"routes\" with one subnet: %+v", c.Networks)
		}
		_, subnet, err := net.ParseCIDR(routes.IPAM.Config[0].Subnet)
		if err != nil {
			t.Fatal(err)
		}
		setPasswords(t)
		var onRoutes []string
		for name, s := range c.Services {
			at := s.attachments(t)
			a, joined := at["routes"]
			if !joined {
				if len(at) == 0 && s.NetworkMode != "none" {
					t.Errorf("service %s names no network (it would join the default one)", name)
				}
				continue
			}
			onRoutes = append(onRoutes, name)
			// A node binds its cluster listener to its routes address, and
			// advertises its alias there.
			conf := ""
			for i, arg := range s.Command {
				if arg == "-c" && i+1 < len(s.Command) {
					conf = strings.TrimPrefix(s.Command[i+1], "/brood/deploy/")
				}
			}
			if conf == "" {
				t.Errorf("service %s is on the routes network but runs no nats-server config", name)
				continue
			}
			o := processConf(t, conf)
			ip := net.ParseIP(a.IPv4)
			if ip == nil || !subnet.Contains(ip) || o.Cluster.Host != a.IPv4 {
				t.Errorf("%s: cluster listener %s, routes address %q in %s: want the listener bound to the routes address", name, o.Cluster.Host, a.IPv4, subnet)
			}
			host, _, err := net.SplitHostPort(o.Cluster.Advertise)
			if err != nil || !slices.Contains(a.Aliases, host) {
				t.Errorf("%s: advertises %q, its aliases on the routes network are %v", name, o.Cluster.Advertise, a.Aliases)
			}
			if o.Cluster.TLSConfig == nil {
				t.Errorf("%s: routes without TLS", name)
			}
		}
		sort.Strings(onRoutes)
		if want := []string{"nats-1", "nats-2", "nats-3"}; !slices.Equal(onRoutes, want) {
			t.Errorf("on the routes network: %v, want only %v", onRoutes, want)
		}
	})

	t.Run("kubernetes", func(t *testing.T) {
		kust, err := os.ReadFile("k8s/kustomization.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var k struct {
			Resources []string `yaml:"resources"`
		}
		if err := yaml.Unmarshal(kust, &k); err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, r := range k.Resources {
			data, err := os.ReadFile(filepath.Join("k8s", r))
			if err != nil {
				t.Fatal(err)
			}
			dec := yaml.NewDecoder(strings.NewReader(string(data)))
			for {
				var doc struct {
					Kind string `yaml:"kind"`
					Spec struct {
						PodSelector struct {
							MatchLabels map[string]string `yaml:"matchLabels"`
						} `yaml:"podSelector"`
						PolicyTypes []string `yaml:"policyTypes"`
						Egress      []struct {
							To    []any `yaml:"to"`
							Ports []struct {
								Port     any    `yaml:"port"`
								Protocol string `yaml:"protocol"`
							} `yaml:"ports"`
						} `yaml:"egress"`
					} `yaml:"spec"`
				}
				if err := dec.Decode(&doc); err != nil {
					break
				}
				if doc.Kind != "NetworkPolicy" || doc.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "brood" {
					continue
				}
				found++
				if !slices.Contains(doc.Spec.PolicyTypes, "Egress") {
					t.Errorf("%s: the NetworkPolicy does not restrict egress", r)
				}
				var ports []string
				for i, e := range doc.Spec.Egress {
					if len(e.Ports) == 0 {
						t.Errorf("%s: egress rule %d allows every port", r, i)
					}
					for _, p := range e.Ports {
						ports = append(ports, fmt.Sprint(p.Port))
					}
				}
				if !slices.Contains(ports, "4222") || slices.Contains(ports, "6222") {
					t.Errorf("%s: egress ports %v: want NATS's client port 4222 and no route port 6222", r, ports)
				}
			}
		}
		if found != 1 {
			t.Fatalf("%d NetworkPolicies select Brood's pods, want 1", found)
		}
		// Every pod of the manifests carries the label the policy selects.
		for _, r := range k.Resources {
			data, _ := os.ReadFile(filepath.Join("k8s", r))
			if strings.Contains(string(data), "\n  template:") && !strings.Contains(string(data), "app.kubernetes.io/name: brood") {
				t.Errorf("%s: pods without the label app.kubernetes.io/name: brood", r)
			}
		}
	})
}
