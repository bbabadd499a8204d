package broker_test

import (
	"bytes"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"saguin.dev/broker/brokertest"
)

// nginxStreamModule is Debian's stream module (package libnginx-mod-stream).
const nginxStreamModule = "/usr/lib/nginx/modules/ngx_stream_module.so"

// nginxConf is the arrangement docs/operations.md describes, for a test:
// nginx's http module terminates TLS with client certificates in front of
// the unix operations door and names the caller in X-Saguin-Principal
// from the certificate it verified — set on every request, so whatever a
// caller sent under that name is replaced, and left out when there is no
// verified certificate; its stream module terminates TLS in front of the
// loopback tcp door, for scrapers with a password. (Never a stream proxy
// in front of a unix door: it would pass on a header the caller wrote.)
const nginxConf = `load_module {{module}};
daemon off;
master_process off;
pid {{dir}}/nginx.pid;
error_log {{dir}}/error.log info;
events { worker_connections 64; }
stream {
    server {
        listen 127.0.0.1:{{streamPort}} ssl;
        ssl_certificate {{cert}};
        ssl_certificate_key {{key}};
        proxy_pass {{tcpDoor}};
    }
}
http {
    access_log {{dir}}/access.log;
    client_body_temp_path {{dir}}/body;
    proxy_temp_path {{dir}}/proxy;
    fastcgi_temp_path {{dir}}/fastcgi;
    uwsgi_temp_path {{dir}}/uwsgi;
    scgi_temp_path {{dir}}/scgi;
    map "$ssl_client_verify:$ssl_client_s_dn" $saguin_principal {
        "~^SUCCESS:(.*,)?CN=(?<cn>[^,]+)" $cn;
        default "";
    }
    server {
        listen 127.0.0.1:{{httpPort}} ssl;
        ssl_certificate {{cert}};
        ssl_certificate_key {{key}};
        ssl_client_certificate {{ca}};
        ssl_verify_client optional;
        location / {
            proxy_pass http://unix:{{socket}}:;
            proxy_set_header X-Saguin-Principal $saguin_principal;
        }
    }
}
`

// freePort is a loopback port nobody listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// docs/operations.md "Who the caller is" behind Debian's nginx: through its stream proxy a scraper
// with the right password gets /metrics and a wrong one 401; through its
// http proxy a certificate whose name the operator file lists reaches
// /v1, one it does not list 403, no certificate 401, and a caller writing
// X-Saguin-Principal itself gets 401: nginx replaced the header.
func TestOperationsBehindNginx(t *testing.T) {
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		t.Fatalf("nginx is not installed (apt-get install nginx libnginx-mod-stream; .ci/run installs them): %v", err)
	}
	if _, err := os.Stat(nginxStreamModule); err != nil {
		t.Fatalf("nginx's stream module is not installed (apt-get install libnginx-mod-stream): %v", err)
	}
	dir, sock := t.TempDir(), opsSocket(t, "ops.sock")
	pki := brokertest.NewPKI(t, dir, "edge-ca")
	front := pki.Server("nginx")
	operators := filepath.Join(dir, "operators")
	writeOperators(t, operators, operator{"alice", ""}, operator{"scraper", "/metrics"})
	b := brokertest.Start(t, opsConfig(t, dir, "", "    password_file: \""+operators+"\"\n    listen:\n      tcp:\n        address: \"127.0.0.1:0\"\n"+
		"      unix:\n        path: \""+sock+"\"\n"))

	streamPort, httpPort := freePort(t), freePort(t)
	conf := strings.NewReplacer("{{module}}", nginxStreamModule, "{{dir}}", dir, "{{streamPort}}", streamPort, "{{httpPort}}", httpPort,
		"{{cert}}", front.CertFile, "{{key}}", front.KeyFile, "{{ca}}", pki.CAFile, "{{socket}}", sock,
		"{{tcpDoor}}", b.OperationsAddr("tcp").String()).Replace(nginxConf)
	confPath := filepath.Join(dir, "nginx.conf")
	writeFileT(t, confPath, conf)
	var out bytes.Buffer
	cmd := exec.Command(nginx, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", confPath)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx:\n%s\n%s", out.String(), log)
		}
	})
	for _, port := range []string{streamPort, httpPort} {
		deadline := time.Now().Add(wait)
		for {
			c, err := net.Dial("tcp", "127.0.0.1:"+port)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-exited:
				t.Fatalf("nginx exited: %s", out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("nginx does not listen on %s: %v", port, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	stream := opsOverTCP(t, "127.0.0.1:"+streamPort, &tls.Config{RootCAs: pki.Pool()})
	stream.must(http.StatusOK, "/metrics", basic("scraper", "pw-scraper"))
	stream.must(http.StatusUnauthorized, "/metrics", basic("scraper", "wrong"))
	stream.must(http.StatusForbidden, "/v1/operations/sessions", basic("scraper", "pw-scraper"))

	as := func(cert *brokertest.Issued) *opsHTTP {
		c := &tls.Config{RootCAs: pki.Pool()}
		if cert != nil {
			c.Certificates = []tls.Certificate{cert.TLSCertificate(t)}
		}
		return opsOverTCP(t, "127.0.0.1:"+httpPort, c)
	}
	alice, mallory := pki.Client("alice", "alice"), pki.Client("mallory", "mallory")
	as(&alice).must(http.StatusOK, "/v1/operations/sessions")
	as(&mallory).must(http.StatusForbidden, "/v1/operations/sessions")
	as(&mallory).must(http.StatusOK, "/metrics")
	as(nil).must(http.StatusUnauthorized, "/v1/operations/sessions")
	as(nil).must(http.StatusUnauthorized, "/v1/operations/sessions", withHeader("X-Saguin-Principal", "alice"))
	as(&mallory).must(http.StatusForbidden, "/v1/operations/sessions", withHeader("X-Saguin-Principal", "alice"))
	as(nil).must(http.StatusOK, "/v1/operations/sessions", basic("alice", "pw-alice"))
	as(nil).must(http.StatusOK, "/health")
}
