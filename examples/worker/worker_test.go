package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"saguin.dev/broker/brokertest"
	"saguin.dev/storage/sqlite"
)

// One attempt per job: a job not acknowledged at its first delivery is
// dead-lettered as soon as its lease ends (a "return", its worker's session
// ending, the visibility timeout), so an empty dead-letter channel at the
// end says every job was acknowledged the first time it was offered.
const config = `
broker:
  id: worker-test
  mqtt:
    listen:
      tcp:
        address: "127.0.0.1:0"
  storage:
    default: main
    default_retention_period: none
    default_retention_bytes: none
    providers:
      main:
        type: sqlite
        file_path: "{{.Dir}}/saguin.db"
channels:
  jobs:
    type: queue
    filter: "jobs/#"
    visibility_timeout: 30s
    retry:
      max_attempts: 1
`

const jobCount = 12

// startWithJobs starts a real broker on a fresh sqlite file and publishes
// jobCount jobs, each acknowledged by the broker (stored) before the next.
func startWithJobs(t *testing.T) (*brokertest.Broker, string, []string) {
	t.Helper()
	dir := t.TempDir()
	b := brokertest.Start(t, brokertest.Config(t, dir, config))
	pub := brokertest.Connect(t, b.Address(), "producer", brokertest.ClientOptions{CleanStart: true})
	var want []string
	for i := 1; i <= jobCount; i++ {
		topic, payload := fmt.Sprintf("jobs/resize/%d", i), fmt.Sprintf(`{"w":%d}`, 100*i)
		r, err := pub.Publish(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
		if err != nil || r.ReasonCode != 0 {
			t.Fatalf("publish %s: %v %v", topic, err, r)
		}
		want = append(want, topic+" "+payload)
	}
	pub.Close()
	return b, filepath.Join(dir, "saguin.db"), want
}

// requireAllAcknowledged stops the broker and reads its database: every job
// published is gone from the queue (resolved), and nothing ever reached the
// dead-letter channel.
func requireAllAcknowledged(t *testing.T, b *brokertest.Broker, dbPath string) {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Fatalf("broker close: %v", err)
	}
	p, err := sqlite.Open(sqlite.Options{Name: "main", FilePath: dbPath, Writer: "worker-test"})
	if err != nil {
		t.Fatalf("reopen the broker's database: %v", err)
	}
	defer p.Close()
	q, err := p.Queue("jobs", "jobs__dlq")
	if err != nil {
		t.Fatal(err)
	}
	if got := q.Next(); got != jobCount+1 {
		t.Fatalf("the queue handed out offsets up to %d; want %d jobs stored", got-1, jobCount)
	}
	if left, _ := q.Items(0, 100); len(left) != 0 {
		t.Errorf("%d job(s) still in the queue, first at offset %d (attempts %d)", len(left), left[0].Offset, left[0].Attempts)
	}
	if dl := q.DeadLetters().Next(); dl != 1 {
		t.Errorf("%d job(s) were dead-lettered; every job should have been acknowledged", dl-1)
	}
}

func TestGoWorkerAcknowledgesEveryJob(t *testing.T) {
	b, db, want := startWithJobs(t)
	var mu sync.Mutex
	var done []string
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	n, err := Work(ctx, Options{Broker: b.Address(), Queue: "jobs", ClientID: "go-worker", Max: jobCount, Out: &out,
		Process: func(job *paho.Publish) error {
			mu.Lock()
			defer mu.Unlock()
			done = append(done, job.Topic+" "+string(job.Payload))
			return nil
		}})
	if err != nil || n != jobCount {
		t.Fatalf("Work answered %d job(s), %v; want %d\n%s", n, err, jobCount, out.String())
	}
	// Offered in offset order, each once, each at its first attempt.
	if strings.Join(done, "\n") != strings.Join(want, "\n") {
		t.Errorf("jobs processed:\n%s\nwant:\n%s", strings.Join(done, "\n"), strings.Join(want, "\n"))
	}
	if got := strings.Count(out.String(), " attempt 1\n"); got != jobCount {
		t.Errorf("%d answers at attempt 1, want %d:\n%s", got, jobCount, out.String())
	}
	requireAllAcknowledged(t, b, db)
}

// A worker that answers "return" hands each job back; with max_attempts 1
// that first return spends the job's attempts, so every job is moved to
// jobs__dlq, keeping its Message ID, with reason attempts_exhausted.
func TestGoWorkerReturningEveryJobDeadLettersIt(t *testing.T) {
	b, db, want := startWithJobs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids := map[string]string{} // topic -> saguin-id as delivered
	n, err := Work(ctx, Options{Broker: b.Address(), Queue: "jobs", ClientID: "failing-worker", Max: jobCount,
		Process: func(job *paho.Publish) error {
			ids[job.Topic] = job.Properties.User.Get("saguin-id")
			return fmt.Errorf("cannot do %s", job.Topic)
		}})
	if err != nil || n != jobCount {
		t.Fatalf("Work answered %d job(s), %v; want %d", n, err, jobCount)
	}
	// The dead letters, read as any append channel is, from the floor.
	r := brokertest.Connect(t, b.Address(), "dlq-reader", brokertest.ClientOptions{CleanStart: true})
	r.Subscribe("jobs/__dlq/#", 1)
	var got []string
	for range jobCount {
		dl := r.Next(20 * time.Second)
		orig := "jobs/" + strings.TrimPrefix(dl.Topic, "jobs/__dlq/")
		u := dl.Properties.User
		if u.Get("saguin-dlq-reason") != "attempts_exhausted" || u.Get("saguin-dlq-channel") != "jobs" ||
			u.Get("saguin-dlq-attempts") != "1" || u.Get("saguin-id") != ids[orig] {
			t.Errorf("dead letter %s: reason %q, channel %q, attempts %q, saguin-id %q (delivered as %q)", dl.Topic,
				u.Get("saguin-dlq-reason"), u.Get("saguin-dlq-channel"), u.Get("saguin-dlq-attempts"), u.Get("saguin-id"), ids[orig])
		}
		got = append(got, orig+" "+string(dl.Payload))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("dead letters:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	r.Close()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	p, err := sqlite.Open(sqlite.Options{Name: "main", FilePath: db, Writer: "worker-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	q, err := p.Queue("jobs", "jobs__dlq")
	if err != nil {
		t.Fatal(err)
	}
	if q.Depth() != 0 || q.DeadLetters().Next() != jobCount+1 {
		t.Errorf("queue holds %d job(s), dead-letter channel %d; want 0 and %d", q.Depth(), q.DeadLetters().Next()-1, jobCount)
	}
}

// pahoPython finds a python3 with Debian's python3-paho-mqtt (which .ci/run
// installs): the one on PATH first, then the system one. The test fails,
// not skips, without it.
func pahoPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if err := exec.Command(py, "-c", "import paho.mqtt.client").Run(); err == nil {
			return py
		}
	}
	t.Fatal("no python3 with paho-mqtt: install Debian's python3-paho-mqtt (.ci/run does)")
	return ""
}

func TestPythonWorkerAcknowledgesEveryJob(t *testing.T) {
	b, db, want := startWithJobs(t)
	host, port, _ := net.SplitHostPort(b.Address())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, pahoPython(t), "worker.py", "--host", host, "--port", port,
		"--queue", "jobs", "--id", "py-worker", "--max", fmt.Sprint(jobCount))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("worker.py: %v\n%s", err, out)
	}
	var done, answers []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "job "):
			// "job <topic> <payload> (saguin-id ..., offset N)"
			f := strings.Fields(line)
			done = append(done, f[1]+" "+f[2])
		case strings.HasPrefix(line, "ack ") || strings.HasPrefix(line, "return "):
			answers = append(answers, line)
		}
	}
	if strings.Join(done, "\n") != strings.Join(want, "\n") {
		t.Errorf("jobs processed:\n%s\nwant:\n%s\nworker output:\n%s", strings.Join(done, "\n"), strings.Join(want, "\n"), out)
	}
	var wantAnswers []string
	for i := 1; i <= jobCount; i++ {
		wantAnswers = append(wantAnswers, fmt.Sprintf("ack jobs/resize/%d attempt 1", i))
	}
	sort.Strings(answers)
	sort.Strings(wantAnswers)
	if strings.Join(answers, "\n") != strings.Join(wantAnswers, "\n") {
		t.Errorf("answers acknowledged by the broker:\n%s\nwant:\n%s", strings.Join(answers, "\n"), strings.Join(wantAnswers, "\n"))
	}
	if !strings.Contains(string(out), fmt.Sprintf("answered %d job(s)", jobCount)) {
		t.Errorf("worker.py did not report %d answers:\n%s", jobCount, out)
	}
	requireAllAcknowledged(t, b, db)
}
