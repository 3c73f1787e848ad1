"""The device's HTTP to the relay and nothing else: the relay client, the account client
that extends it, and the bounded event-stream reader. The bottom layer: it imports no vault,
sync or session code."""
