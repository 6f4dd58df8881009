// Package deploy_test checks deploy/ without a Docker engine: nginx.conf
// passes `nginx -t` (with the compose hostnames replaced by loopback
// ports), every app service's command in docker-compose.yml parses with the
// real serve flag set and agrees with nginx.conf, the Dockerfile and the
// policies file.
package deploy_test

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/holdfast/holdfast/cmd/demo/serve"
	"github.com/holdfast/holdfast/config"
)

// The paths the Dockerfile and the compose file agree on.
const (
	configPath = "/etc/holdfast/policies.yaml"
	stateDir   = "/var/lib/holdfast"
	appPort    = "8080"
)

var apps = []string{"app1", "app2", "app3", "app4"}

// nginxBinary finds nginx on PATH or in /usr/sbin, where Debian puts it.
func nginxBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	t.Fatal("nginx not found on PATH or in /usr/sbin: run `make deps` (Debian package nginx)")
	return ""
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestNginxConf(t *testing.T) {
	conf := read(t, "nginx.conf")
	for _, app := range apps {
		if !strings.Contains(conf, "server "+app+":"+appPort) {
			t.Errorf("nginx.conf has no upstream server %s:%s", app, appPort)
		}
	}
	for _, want := range []string{"proxy_pass http://holdfast;", "proxy_set_header X-Client-ID $http_x_client_id;", "listen 80;"} {
		if !strings.Contains(conf, want) {
			t.Errorf("nginx.conf lacks %q", want)
		}
	}
	// The compose hostnames do not resolve here: point them at loopback
	// ports, and keep everything nginx writes in a temp dir.
	dir := t.TempDir()
	for _, app := range apps {
		conf = strings.ReplaceAll(conf, app+":"+appPort, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	}
	conf = strings.Replace(conf, "listen 80;", fmt.Sprintf("listen 127.0.0.1:%d;", freePort(t)), 1)
	conf = strings.Replace(conf, "pid /tmp/nginx.pid;", "pid "+filepath.Join(dir, "nginx.pid")+";", 1)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(nginxBinary(t), "-t", "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log")).CombinedOutput()
	if err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
}

// compose is the part of docker-compose.yml the tests read.
type compose struct {
	Services map[string]struct {
		Image     string   `yaml:"image"`
		Command   []string `yaml:"command"`
		Volumes   []string `yaml:"volumes"`
		Ports     []string `yaml:"ports"`
		DependsOn []string `yaml:"depends_on"`
		Build     struct {
			Context    string `yaml:"context"`
			Dockerfile string `yaml:"dockerfile"`
		} `yaml:"build"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

func loadCompose(t *testing.T) compose {
	t.Helper()
	var c compose
	if err := yaml.Unmarshal([]byte(read(t, "docker-compose.yml")), &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// clearServeEnv unsets the variables that would give serve's flags other
// defaults than a container has.
func clearServeEnv(t *testing.T) {
	fs, _ := serve.FlagSet(io.Discard)
	for _, name := range []string{"listen", "redis", "backend", "id", "config", "state-dir", "expected-instances",
		"call-timeout", "probe-interval", "heartbeat", "shutdown-timeout", "log-format"} {
		if fs.Lookup(name) == nil {
			t.Fatalf("serve has no flag --%s", name)
		}
		t.Setenv(serve.EnvName(name), "")
		os.Unsetenv(serve.EnvName(name))
	}
}

func TestComposeCommandsMatchServeFlags(t *testing.T) {
	clearServeEnv(t)
	c := loadCompose(t)
	var want []string
	for name := range c.Services {
		want = append(want, name)
	}
	slices.Sort(want)
	if !slices.Equal(want, []string{"app1", "app2", "app3", "app4", "nginx", "redis"}) {
		t.Errorf("services %v, want redis, app1-app4, nginx", want)
	}
	for _, app := range apps {
		s := c.Services[app]
		if len(s.Command) == 0 || s.Command[0] != "serve" {
			t.Errorf("%s: command %v does not start with serve", app, s.Command)
			continue
		}
		o, err := serve.Parse(s.Command[1:], io.Discard)
		if err != nil {
			t.Errorf("%s: serve rejects its command: %v", app, err)
			continue
		}
		checks := []struct {
			what      string
			got, want any
		}{
			{"--id", o.ID, app},
			{"--listen", o.Listen, ":" + appPort},
			{"--redis", o.Redis, "redis://redis:6379/0"},
			{"--config", o.Config, configPath},
			{"--state-dir", o.StateDir, stateDir},
			{"--expected-instances", o.ExpectedInstances, len(apps)},
			{"state volume", slices.Contains(s.Volumes, app+"-state:"+stateDir), true},
			{"named volume", c.Volumes != nil && hasKey(c.Volumes, app+"-state"), true},
			{"build context", s.Build.Context, ".."},
			{"dockerfile", s.Build.Dockerfile, "deploy/Dockerfile"},
			{"depends on redis", slices.Contains(s.DependsOn, "redis"), true},
		}
		for _, ch := range checks {
			if ch.got != ch.want {
				t.Errorf("%s: %s = %v, want %v", app, ch.what, ch.got, ch.want)
			}
		}
	}
	redis := strings.Join(c.Services["redis"].Command, " ")
	if !strings.Contains(redis, "--appendonly yes") || !strings.Contains(redis, "--appendfsync always") {
		t.Errorf("redis command %q: want the append-only file, fsync always", redis)
	}
	ng := c.Services["nginx"]
	if !slices.Contains(ng.Volumes, "./nginx.conf:/etc/nginx/nginx.conf:ro") {
		t.Errorf("nginx volumes %v: want deploy/nginx.conf mounted", ng.Volumes)
	}
	for _, app := range apps {
		if !slices.Contains(ng.DependsOn, app) {
			t.Errorf("nginx does not depend on %s", app)
		}
	}
}

func hasKey(m map[string]any, k string) bool { _, ok := m[k]; return ok }

func TestDockerfile(t *testing.T) {
	df := read(t, "Dockerfile")
	from := regexp.MustCompile(`(?m)^FROM (\S+)(?: AS (\S+))?$`).FindAllStringSubmatch(df, -1)
	if len(from) != 2 || from[0][1] != "golang:1.26" || from[0][2] != "build" || !strings.HasSuffix(from[1][1], "-slim") ||
		!strings.HasPrefix(from[1][1], "debian:") {
		t.Errorf("stages %v: want golang:1.26 AS build, then a debian slim runtime", from)
	}
	for _, want := range []string{"go build", "./cmd/demo", "COPY --from=build", "COPY deploy/policies.yaml " + configPath,
		`ENTRYPOINT ["holdfast-demo"]`, "USER holdfast", stateDir} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	// The default command parses too.
	cmd := regexp.MustCompile(`(?m)^CMD \[(.*)\]$`).FindStringSubmatch(df)
	if cmd == nil {
		t.Fatal("Dockerfile has no CMD")
	}
	var args []string
	if err := yaml.Unmarshal([]byte("["+cmd[1]+"]"), &args); err != nil || args[0] != "serve" {
		t.Fatalf("CMD %s: %v", cmd[1], err)
	}
	clearServeEnv(t)
	if _, err := serve.Parse(args[1:], io.Discard); err != nil {
		t.Errorf("serve rejects the Dockerfile's CMD: %v", err)
	}
	// go.mod's Go version is the build image's.
	if gomod := read(t, "../go.mod"); !strings.Contains(gomod, "\ngo 1.26") {
		t.Error("go.mod is not Go 1.26: update the build image")
	}
}

func TestPoliciesLoad(t *testing.T) {
	c, err := config.LoadFile("policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, p := range c.Policies {
		paths = append(paths, p.Path)
		if p.Key.Header() != "X-Client-Id" {
			t.Errorf("policy %s keyed by %s, want the X-Client-ID header nginx passes", p.Name, p.Key)
		}
	}
	if !slices.Equal(paths, []string{"/api/tb", "/api/sw", "/api/sc"}) {
		t.Errorf("paths %v", paths)
	}
}
