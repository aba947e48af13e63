"""x"""
NAME="x"; HELP="x"; DEFAULT_PORT=22133; THROUGHPUT=False
def add_arguments(p): pass
def run(args, ctx): pass
