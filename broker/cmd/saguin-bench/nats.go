package main

// NATS server's MQTT listener as a reference broker: the durable MQTT
// 3.1.1 peer (its sessions and QoS 1 messages live in JetStream). It is
// not a dependency of any module here: `make bench` installs the pinned
// release into <repo>/bin with `go install`, and, when that binary is
// missing, this command does the same before the run.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"saguin.dev/broker/internal/loadgen"
)

// natsModule is the release measured: the version the table names.
const natsModule = "github.com/nats-io/nats-server/v2@v2.15.2"

// findNATS returns the nats-server binary: -nats-server when given, else
// <repo>/bin/nats-server, built there with `go install` when missing.
func findNATS(ctx context.Context, flagPath, src string) (string, error) {
	if flagPath != "" {
		if _, err := os.Stat(flagPath); err == nil {
			return flagPath, nil
		}
	}
	if src == "" {
		var err error
		if src, err = findModule(); err != nil {
			return "", err
		}
	}
	bin := flagPath
	if bin == "" {
		bin = filepath.Join(filepath.Dir(src), "bin", "nats-server")
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "install", natsModule)
	// Outside our modules and workspace: nats-server is a tool the bench
	// runs, never a dependency of saguin.dev/*.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOBIN="+filepath.Dir(bin), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %w\n%s", natsModule, err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// natsVersion asks the binary for its version.
func natsVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "nats-server (version unknown)"
	}
	return strings.TrimSpace(string(out))
}

// natsConfig is the whole configuration: an MQTT listener on loopback and
// JetStream, which NATS's MQTT needs (with a server name), storing in dir.
// The client port is free too, so two runs never collide. Every other
// setting is the server's default.
func natsConfig(dir string, clientPort, mqttPort int) string {
	return fmt.Sprintf(`# written by saguin-bench
server_name: saguin_bench
listen: 127.0.0.1:%d
jetstream {
  store_dir: %q
}
mqtt {
  listen: 127.0.0.1:%d
}
`, clientPort, filepath.Join(dir, "jetstream"), mqttPort)
}

// startNATS runs nats-server on a fresh configuration in dir and waits for
// its MQTT listener.
func startNATS(ctx context.Context, bin, dir string) (*brokerProc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 {
		cport, err := loadgen.FreePort()
		if err != nil {
			return nil, err
		}
		mport, err := loadgen.FreePort()
		if err != nil {
			return nil, err
		}
		conf := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(conf, []byte(natsConfig(dir, cport, mport)), 0o644); err != nil {
			return nil, fmt.Errorf("nats: write config: %w", err)
		}
		p := &brokerProc{name: "nats", addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(mport)),
			exited: make(chan struct{}), out: loadgen.NewTailBuffer(32 << 10)}
		p.cmd = exec.Command(bin, "-c", conf)
		p.cmd.Stderr = p.out
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := p.cmd.Start(); err != nil {
			return nil, fmt.Errorf("nats: start: %w", err)
		}
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				_, _ = p.out.Write(append(sc.Bytes(), '\n'))
			}
		}()
		go func() {
			_ = p.cmd.Wait()
			close(p.exited)
		}()
		if lastErr = waitDialable(ctx, p); lastErr == nil {
			// The listener accepts before JetStream has its MQTT streams:
			// a first CONNECT proves the whole path.
			if lastErr = probeMQTT(ctx, p.addr, mqtt311); lastErr == nil {
				return p, nil
			}
		}
		_ = p.stop(5 * time.Second)
	}
	return nil, lastErr
}

// probeMQTT connects until a CONNACK is success, for at most 20 s.
func probeMQTT(ctx context.Context, addr string, version byte) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := wDial(ctx, addr, wdial{id: "bench-probe", version: version, clean: true, timeout: 5 * time.Second})
		if err == nil {
			c.disconnect()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no MQTT CONNACK from %s: %w", addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
