module saguin.dev/linearizability

go 1.26.0

require github.com/anishathalye/porcupine v1.3.1

require pgregory.net/rapid v1.3.0
