"""gcp-storage-emulator as the GCS tests run it: `python gcs_emulator.py HOST PORT BUCKET`.

Its object downloads lack the x-goog-generation header real GCS sends with every object's bytes,
which TensorStore's gcs kvstore needs (it refuses the answer without one: "Malformed
StorageGeneration"); this adds it, from the object's own record, before the emulator answers."""
import sys

from gcp_storage_emulator import server
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
    try:
        record = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = str(record["generation"])
        response["x-goog-metageneration"] = str(record.get("metageneration", "1"))
    except Exception:  # noqa: BLE001 - a missing object is the emulator's own 404 to give
        pass
    return _download(request, response, storage, *args, **kwargs)


objects.download = download  # objects.get calls it by this name for ?alt=media
server.HANDLERS = tuple((regex, {m: download if h is _download else h for m, h in handlers.items()})
                        for regex, handlers in server.HANDLERS)

if __name__ == "__main__":
    host, port, bucket = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    server.create_server(host, port, in_memory=True, default_bucket=bucket).run()
