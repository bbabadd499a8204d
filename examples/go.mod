module saguin.dev/examples

go 1.26

require github.com/eclipse/paho.golang v0.23.0 // indirect
