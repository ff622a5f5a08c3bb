"""HTTP/1.1 and Server-Sent Events over reassembled TCP streams, sans-IO.

`exchange.Connection` is the StreamHandler of one flow: it runs a
`reader.MessageReader` per direction (heads and chunked bodies parsed by llhttp
through httptools) and pairs requests with responses into `Exchange` values.
"""
